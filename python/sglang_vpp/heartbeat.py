"""How often an idle leader tells its followers it is alive: one period for every executor.

The reference runtime's control thread (``runtime/control.py``: ``Heartbeat`` ops to the follower
ranks, whose control wait would time out) and the SGLang plugin's leader loop (``VppConfig.heartbeat_s``,
down the pipeline, whose comm wait would) send it for the same reason. A module of its own, free of
imports, so the runtime reads it without the plugin (which imports SGLang) and the plugin without
the runtime (which imports torch).
"""

from __future__ import annotations

__all__ = ["DEFAULT_HEARTBEAT_S"]

DEFAULT_HEARTBEAT_S = 1.0
"""Seconds between heartbeats of an idle leader: far below any timeout a run takes (the default
comm and control timeouts are a minute and more), so a quiet pipeline is never mistaken for a
dead one; the plugin's ``SGLANG_VPP_HEARTBEAT_S`` overrides it."""
