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

The same order makes every suffix of the sequence a bound too: nothing of chunk k or a later chunk
runs on rank r before chunk k is released and has reached r, so

    bound_r(k) = release(k) + fill_r(k) + work_r(k..) + drain_r

where ``release(k)`` is the latest arrival among chunks 0..k's requests (chunk k follows them on
stage 0) and ``work_r(k..)`` the stage time of chunks k onwards on r's stages. The bound is the
largest over k (k = 0 is the form above): with requests that arrive over time the first arrival
says little about when the last request could finish, and a later chunk with a longer path to r
can raise it too. Arrivals are the workload's: a closed-loop client sends a request when an
earlier one completes, which depends on the mode's own schedule, so those send times would make
each mode's bound follow its own completions (every mode close to "its" bound); the workload's
arrivals keep the bound a property of the work.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def lower_bound(schedule: Schedule, cost: StageCostModel, result: SimResult | None = None,
                arrivals: Sequence[float] | None = None) -> float:
    """Makespan lower bound of ``schedule`` under ``cost`` (see the module docstring).
    ``arrivals``: the workload's arrival per request index (default: the schedule's requests',
    which for a closed-loop run are the send times)."""
    if not schedule.chunks:
        return 0.0
    layout = schedule.layout
    chunks = schedule.chunks
    if result is not None and result.stage_totals_s and any(result.stage_totals_s):
        totals = list(result.stage_totals_s)
    else:
        totals = [0.0] * layout.num_stages
        for chunk in chunks:
            for spec in layout.stages:
                totals[spec.stage_index] += cost.stage_cost(spec, chunk)
    ranks = range(layout.num_ranks)
    rank_work = [sum(totals[s] for s in layout.stages_of(rank)) for rank in ranks]
    drains = [_drain(schedule, cost, chunks[-1], rank) for rank in ranks]
    release = _releases(schedule, arrivals)
    best = max(_rank_bound(schedule, cost, chunks[0], release(chunks[0]), rank, rank_work[rank], drains[rank])
               for rank in ranks)
    # Later suffixes: their work is the total less the chunks before them, on the cost model.
    done = [0.0] * layout.num_ranks  # work of the chunks before the current one, per rank
    latest = release(chunks[0])
    for before, chunk in zip(chunks, chunks[1:]):
        for rank in ranks:
            done[rank] += sum(cost.stage_cost(layout.stages[s], before) for s in layout.stages_of(rank))
        latest = max(latest, release(chunk))
        best = max(best, *(_rank_bound(schedule, cost, chunk, latest, rank, rank_work[rank] - done[rank], drains[rank])
                           for rank in ranks))
    return best


def _releases(schedule: Schedule, arrivals: Sequence[float] | None):
    """A chunk's release: the latest arrival among its requests."""
    known = list(arrivals) if arrivals is not None else [request.arrival for request in schedule.requests]

    def release(chunk) -> float:
        return max(known[part.request_index] for part in chunk.parts) if known else 0.0  # no requests: a bare plan

    return release


def _drain(schedule: Schedule, cost: StageCostModel, last, rank: int) -> float:
    """The last chunk's stage times and hops after ``rank``'s last stage."""
    layout = schedule.layout
    mine = layout.stages_of(rank)
    drain = _path_time(schedule, cost, last, range(mine[-1] + 1, layout.num_stages))
    # Hops into the rank's first stage count towards the fill (the range covers the stage before
    # it, whose hop is added), hops out of its last stage towards the drain.
    if mine[-1] + 1 < layout.num_stages and layout.stages[mine[-1] + 1].rank != rank:
        drain += cost.transfer_cost(layout.stages[mine[-1]], last)
    return drain


def _rank_bound(schedule: Schedule, cost: StageCostModel, chunk, release: float, rank: int, work: float,
                drain: float) -> float:
    """``release`` + ``chunk``'s path to ``rank``'s first stage + ``work`` + ``drain``."""
    fill = _path_time(schedule, cost, chunk, range(0, schedule.layout.stages_of(rank)[0]))
    return release + fill + work + drain


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
