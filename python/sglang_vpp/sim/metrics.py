"""Derived metrics of one simulated run (definitions in docs/metrics.md).

``lower_bound``: no executor can finish a schedule's work faster than its busiest rank can
compute, after the first chunk has reached that rank and before the last chunk has left the
pipeline behind it. For rank r:

    bound_r = release + fill_r + work_r + drain_r

- ``work_r``: total stage time of r's stages (its computes cannot overlap);
- ``fill_r``: the first chunk's stage time and hops on the stages before r's first stage;
- ``drain_r``: the last chunk's stage time and hops on the stages after r's last stage.

Every stage processes chunks in one global order (the schedule core's contract), so the first and
last chunks of the sequence are first and last on every stage and the bound is valid for that
schedule's chunking and layout. (``work + fill`` alone is also a bound; adding the drain keeps it
a bound and makes it tighter.)
"""

from __future__ import annotations

from ..schedule import Schedule, StageCostModel
from .idle import ROUNDING
from .result import SimResult

__all__ = ["lower_bound", "gap_to_bound", "steady_state_window", "steady_state_idle"]


def _path_time(schedule: Schedule, cost: StageCostModel, chunk, stages: range) -> float:
    layout = schedule.layout
    total = 0.0
    for stage in stages:
        spec = layout.stages[stage]
        total += cost.stage_cost(spec, chunk)
        following = stage + 1
        if following < layout.num_stages and layout.stages[following].rank != spec.rank:
            total += cost.transfer_cost(spec, chunk)
    return total


def lower_bound(schedule: Schedule, cost: StageCostModel, result: SimResult | None = None) -> float:
    """Makespan lower bound of ``schedule`` under ``cost`` (see the module docstring)."""
    if not schedule.chunks:
        return 0.0
    layout = schedule.layout
    if result is not None and result.stage_totals_s and any(result.stage_totals_s):
        totals = list(result.stage_totals_s)
    else:
        totals = [0.0] * layout.num_stages
        for chunk in schedule.chunks:
            for spec in layout.stages:
                totals[spec.stage_index] += cost.stage_cost(spec, chunk)
    first, last = schedule.chunks[0], schedule.chunks[-1]
    release = 0.0
    if result is not None:
        release = result.request_release_s.get(first.request_index, 0.0)
    elif schedule.requests:
        release = schedule.requests[first.request_index].arrival
    best = 0.0
    for rank in range(layout.num_ranks):
        mine = layout.stages_of(rank)
        work = sum(totals[s] for s in mine)
        # Hops into the rank's first stage count towards the fill (the range covers the stage
        # before it, whose hop is added), hops out of its last stage towards the drain.
        fill = _path_time(schedule, cost, first, range(0, mine[0]))
        drain = _path_time(schedule, cost, last, range(mine[-1] + 1, layout.num_stages))
        if mine[-1] + 1 < layout.num_stages and layout.stages[mine[-1] + 1].rank != rank:
            drain += cost.transfer_cost(layout.stages[mine[-1]], last)
        best = max(best, release + fill + work + drain)
    return best


def gap_to_bound(makespan: float, bound: float) -> float:
    """How far above the bound a run finished, as a fraction (0.05 = 5 % slower than the bound).
    A run that meets its bound is 0, not the float rounding of the two sums (printed -0.0 %)."""
    if bound <= 0:
        return 0.0
    gap = makespan / bound - 1.0
    return 0.0 if abs(gap) < ROUNDING else gap


def steady_state_window(result: SimResult) -> tuple[float, float]:
    """``[first chunk done, last chunk enters stage 0]``: the pipeline is full in between.

    Before it ranks wait for the first chunk (fill); after it they wait for the last one (drain).
    """
    computes = [s for s in result.timeline if s.kind == "compute"]
    if not computes:
        return (0.0, 0.0)
    first_key = min((s.request_index, s.chunk_index) for s in computes)
    last_key = max((s.request_index, s.chunk_index) for s in computes)
    start = max(s.end for s in computes if (s.request_index, s.chunk_index) == first_key)
    end = min(s.start for s in computes if (s.request_index, s.chunk_index) == last_key and s.stage_index == 0)
    return (start, max(start, end))


def steady_state_idle(result: SimResult) -> list[float]:
    """Per rank: time without compute inside ``steady_state_window`` (imbalance bubble plus any
    exposed comm there). Needs a result recorded with ``SimConfig(record_timeline=True)``."""
    start, end = steady_state_window(result)
    idle = []
    for rank in range(result.num_ranks):
        busy = 0.0
        for s in result.timeline:
            if s.rank == rank and s.kind == "compute":
                busy += max(0.0, min(s.end, end) - max(s.start, start))
        idle.append(max(0.0, (end - start) - busy))
    return idle
