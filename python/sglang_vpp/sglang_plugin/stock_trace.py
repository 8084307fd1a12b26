"""``--vpp-trace DIR`` for stock pipelines (``--pp-mode cpp`` / ``dcpp``): per-rank compute records.

Why: comparing "idle of vpp-pack vs cpp" needs cpp's own measurements, taken the
same way as the VPP loop's (``accounting.RankAccounting``: wall interval and thread CPU time per
compute, files ``vpp_rank<r>.json`` / ``vpp_rank<r>.records.json``). Stock SGLang is not changed:
two hooks only observe it, and only when the flag is given.

    managers.scheduler.Scheduler.run_batch  AROUND  time one forward of this rank
    managers.scheduler.Scheduler.on_idle    AFTER   write the files (``write`` skips when nothing is new)

Record fields: ``stage`` = this rank (a contiguous pipeline has one stage per rank), ``seq`` =
``batch.forward_iter`` (SGLang's per-rank forward counter; PP ranks run the same batches in the
same order, so it names the same micro-batch on every rank). The dynamic-chunking profiler calls
the model runner directly, not ``run_batch``, so its synthetic forwards are not recorded.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_vpp.sglang_plugin.accounting import RankAccounting

__all__ = ["install_stock_trace"]

logger = logging.getLogger(__name__)

_P = "sglang.srt.managers.scheduler.Scheduler."
_accounting: RankAccounting | None = None


def _rank_accounting(scheduler: Any, trace_dir: str) -> RankAccounting:
    global _accounting
    if _accounting is None:
        from sglang.srt.runtime_context import get_parallel

        _accounting = RankAccounting(rank=int(get_parallel().pp_rank), trace_dir=trace_dir)
    return _accounting


def _num_tokens(batch: Any) -> int:
    if batch.forward_mode.is_extend():
        return int(batch.extend_num_tokens or 0)
    return len(batch.reqs)


def install_stock_trace(trace_dir: str) -> None:
    """Register the two observing hooks in this scheduler process (the caller applies them)."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    def around_run_batch(original, scheduler, batch, *args, **kwargs):
        acct = _rank_accounting(scheduler, trace_dir)
        timer = acct.start()
        result = original(scheduler, batch, *args, **kwargs)
        acct.finish(
            timer,
            stage=acct.rank,
            seq=int(getattr(batch, "forward_iter", len(acct.records))),
            is_prefill=bool(batch.forward_mode.is_extend()),
            num_tokens=_num_tokens(batch),
        )
        return result

    def after_on_idle(result, scheduler, *args, **kwargs):
        if _accounting is not None:
            _accounting.write()  # a no-op when nothing new was recorded
        return result

    register_hook(_P + "run_batch", around_run_batch, HookType.AROUND)
    register_hook(_P + "on_idle", after_on_idle, HookType.AFTER)
    logger.info("sglang-vpp: stock pipeline trace to %s", trace_dir)
