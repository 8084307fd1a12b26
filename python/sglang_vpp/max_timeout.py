"""The longest timeout anything in sglang-vpp takes: one bound for every command and server flag.

A module of its own, free of imports, so the CLI (which starts without torch) and the SGLang plugin
(``--vpp-comm-timeout``, ``SGLANG_VPP_COMM_TIMEOUT_S``) read the same number; ``comm/config.py``,
next to the served default, would import torch through the ``comm`` package.
"""

from __future__ import annotations

__all__ = ["MAX_TIMEOUT_S"]

MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""A week. The waits a timeout bounds count milliseconds in C ints (gloo, NCCL) or go to
``timedelta`` and thread waits; ``inf`` or 1e300 s fails there with a traceback, and inside an
SGLang scheduler process only after start-up, so every timeout is refused above this up front."""
