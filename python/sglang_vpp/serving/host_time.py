"""Host time per micro-batch of a served run, from the ``--vpp-trace`` records (pure Python).

What it is: each record's ``host_cpu_s`` is the scheduler thread's CPU time between the rank's
previous forward and this one (``trace_records.ComputeRecord``): scheduling, SGLang's batch
building, messages, TP agreement, processing results. The VPP loop and stock PP
(``sglang_plugin/stock_trace.py``) record it the same way, so the two loops compare directly.

Per rank, one micro-batch's host time is the sum over its forwards on that rank (stock PP: one;
a fold-back rank: two, its forward and its fold-back stage). The median over the micro-batches
of the window is the number reported: a gap that spans an idle stretch (the stock loop spins
while it waits for requests) is an outlier, not the loop's cost per micro-batch, and each rank's
first forward of the window is left out (its gap spans the pause before the run).

Thread CPU time, not wall clock: on cores shared by the ranks the wall gap is mostly the other
rank's turn. Comm threads (the VPP transport's channel threads, gloo's send threads) are not the
scheduler thread and count in neither loop.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["HostTime", "host_time", "host_spread", "WITHIN"]

WITHIN = 0.10
"""A mode's host time per micro-batch counts as the stock loop's when at most this much above it."""


@dataclass(frozen=True)
class HostTime:
    """One measured window's host time per rank (seconds)."""

    per_micro_batch_s: list[float]
    """Per rank: median over micro-batches of the host CPU time before its forwards there."""
    per_forward_s: list[float]
    """Per rank: median over forwards of the host CPU time before each."""
    forwards_per_micro_batch: list[float]
    """Per rank: forwards / micro-batches in the window (stock 1, fold-back 2)."""
    num_micro_batches: int

    def to_json(self) -> dict:
        return {"per_micro_batch_s": self.per_micro_batch_s, "per_forward_s": self.per_forward_s,
                "forwards_per_micro_batch": self.forwards_per_micro_batch,
                "num_micro_batches": self.num_micro_batches}


def host_time(records: Sequence[dict], num_ranks: int, after_seq: int = -1) -> HostTime | None:
    """Host time of the micro-batches after ``after_seq`` (all forwards, prefill and decode);
    None when some rank has fewer than two forwards there or the records carry no host time."""
    window = [r for r in records if r["seq"] > after_seq]
    if not window or any("host_cpu_s" not in r for r in window):
        return None
    per_mb, per_fwd, ratio = [], [], []
    for rank in range(num_ranks):
        mine = sorted((r for r in window if r["rank"] == rank), key=lambda r: r["start_s"])[1:]
        if not mine:
            return None
        by_seq: dict[int, float] = {}
        for record in mine:
            by_seq[record["seq"]] = by_seq.get(record["seq"], 0.0) + record["host_cpu_s"]
        per_mb.append(statistics.median(by_seq.values()))
        per_fwd.append(statistics.median(r["host_cpu_s"] for r in mine))
        ratio.append(len(mine) / len(by_seq))
    return HostTime(per_mb, per_fwd, ratio, len({r["seq"] for r in window}))


def host_spread(runs: Sequence[HostTime | None]) -> dict | None:
    """Per rank: min / median / max over repeats of the per-micro-batch and per-forward host
    time (ms) and the forwards per micro-batch; the micro-batches per repeat (a mode that
    spreads the same decode steps over more micro-batches pays its host time more often);
    None when no repeat measured it."""
    measured = [run for run in runs if run is not None]
    if not measured:
        return None

    def spread(values: list[float]) -> dict[str, float]:
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    num_ranks = len(measured[0].per_micro_batch_s)
    return {
        "repeats": len(measured),
        "per_micro_batch_ms": [spread([run.per_micro_batch_s[k] * 1e3 for run in measured]) for k in range(num_ranks)],
        "per_forward_ms": [spread([run.per_forward_s[k] * 1e3 for run in measured]) for k in range(num_ranks)],
        "forwards_per_micro_batch": [spread([run.forwards_per_micro_batch[k] for run in measured])
                                     for k in range(num_ranks)],
        "micro_batches": spread([float(run.num_micro_batches) for run in measured]),
    }  # fmt: skip
