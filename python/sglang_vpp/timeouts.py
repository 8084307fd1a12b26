"""The longest timeout anything in sglang-vpp takes: one bound for every command and server flag;
and the default wait of one communication outside a server.

A module of its own, free of imports, so the CLI (which starts without torch), the reference
runtime's ``Timeouts`` and the SGLang plugin (``--vpp-comm-timeout``, ``SGLANG_VPP_COMM_TIMEOUT_S``)
read the same numbers; ``comm/config.py``, next to the served default, would import torch through
the ``comm`` package (which re-exports ``COMM_TIMEOUT_S``).
"""

from __future__ import annotations

__all__ = ["COMM_TIMEOUT_S", "MAX_TIMEOUT_S"]

MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""A week. The waits a timeout bounds count milliseconds in C ints (gloo, NCCL) or go to
``timedelta`` and thread waits; ``inf`` or 1e300 s fails there with a traceback, and inside an
SGLang scheduler process only after start-up, so every timeout is refused above this up front."""

COMM_TIMEOUT_S = 60.0
"""Default wait of one send or receive (``CommConfig.timeout_s``) and of the reference runtime's
(``Timeouts.comm_s``, ``bench --timeout``). A served pipeline waits longer by default
(``comm.config.SERVED_COMM_TIMEOUT_S``)."""
