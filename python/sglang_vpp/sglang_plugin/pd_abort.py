"""Let an abort end a request in chunked prefill on a stock pipeline-parallel prefill server.

SGLang's ``Scheduler.abort_request`` does not tear down the request in chunked prefill (the
scheduler's ``chunked_req``): it only records it in ``_pending_chunked_abort_req``, and
``process_pending_chunked_abort`` ends it at the top of the next scheduling step (KV freed, the
sender aborted, the client told). The pp-1 prefill loop and the plain loops call that from
their get-next-batch step; the pipeline-parallel prefill loop
(``SchedulerPPMixin.event_loop_pp_disagg_prefill``) never does. So on a ``--pp-size > 1``
prefill server an abort (``/abort_request``, a client that disconnects, the router dropping the
request) of a prompt longer than one chunk is recorded and ignored: its prefill runs to the end
and its KV is sent.

The hook calls ``process_pending_chunked_abort`` first thing in ``process_prefill_chunk``, the
step where that loop deals with ``chunked_req`` each micro-batch, the same place the pp-1 loop
calls it. Every rank receives the abort in the same message stream and so ends the request at
the same step. Without a pending abort the call returns at once: results are unchanged.

Data flow (each scheduler process of a ``--disaggregation-mode prefill --pp-size > 1`` server
in a stock mode)::

    event_loop_pp_disagg_prefill -> Scheduler.process_prefill_chunk(self, ...)
        [BEFORE hook] -> Scheduler.process_pending_chunked_abort(self)
"""

from __future__ import annotations

from typing import Any

__all__ = ["PREFILL_CHUNK_TARGET", "install_pd_abort_hook"]

PREFILL_CHUNK_TARGET = "sglang.srt.managers.scheduler.Scheduler.process_prefill_chunk"


def _end_pending_chunked_abort(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    scheduler.process_pending_chunked_abort()


def install_pd_abort_hook(server_args: Any) -> bool:
    """Register the hook on a pp > 1 prefill server; return whether this process needs it."""
    if getattr(server_args, "disaggregation_mode", None) != "prefill":
        return False
    if int(getattr(server_args, "pp_size", 1) or 1) <= 1:
        return False
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook(PREFILL_CHUNK_TARGET, _end_pending_chunked_abort, HookType.BEFORE)
    return True
