"""Measured accounting of a run: per-rank compute / exposed communication / idle, TTFT, timeline.

Data flow: every rank's ``ActionRecord``\\ s (one time axis, see ``records``) -> ``measure_run``
-> ``MeasuredRun``: the same quantities the simulator reports (``sim.entities.RankStats``,
definitions in docs/metrics.md), so measured and replayed runs compare field by field:

- ``compute_s``: wall time inside stage computes.
- ``exposed_comm_s``: wall time a rank was held by a communication action *after* the data it
  carries was produced. For a receive: from ``max(reached, producer's compute end)`` to delivery;
  before that the rank waits for data that does not exist yet, which is idle. A blocking send
  (vpp): the whole hold. An asynchronous send: the posting time only.
- ``bubble_s`` (idle): ``makespan - compute_s - exposed_comm_s``; it includes waiting for data,
  for arrivals, the fill and the drain.
- ``makespan_s``: from the epoch (every rank ready) to the last action's end on any rank.
- ``ttft_s``: per request, the end of its last chunk's last stage minus its arrival.

On this machine the ranks share 2 vCPUs: wall-clock compute is inflated by time slicing, so these
numbers describe this run on this host; ``replay`` derives the dedicated-hardware timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean

from ..schedule import ChunkSpec
from ..sim.entities import RankStats, SliceKind, TimelineSlice, bubble_ratio, mean_ttft_s
from .records import ActionRecord, RankReport

__all__ = ["MeasuredRun", "measure_run"]


@dataclass
class MeasuredRun:
    makespan_s: float
    per_rank: list[RankStats]
    request_ttft_s: dict[int, float]
    compute_cost_s: float
    """Sum over ranks of the computes' own cost (thread CPU time on CPU): the work, not the wall."""
    num_chunks: int
    timeline: list[TimelineSlice] = field(default_factory=list)

    @property
    def compute_s(self) -> float:
        """Mean over ranks (as the simulator reports it)."""
        return fmean(r.compute_s for r in self.per_rank)

    @property
    def exposed_comm_s(self) -> float:
        return fmean(r.exposed_comm_s for r in self.per_rank)

    @property
    def bubble_s(self) -> float:
        return fmean(r.bubble_s for r in self.per_rank)

    @property
    def bubble_ratio(self) -> float:
        return bubble_ratio(self.per_rank, self.makespan_s)

    @property
    def ttft_s(self) -> float:
        return mean_ttft_s(self.request_ttft_s)


def _compute_ends(reports: Sequence[RankReport]) -> dict[tuple[int, int, int], float]:
    return {r.key: r.end_s for report in reports for r in report.records if r.is_compute}


def measure_run(reports: Sequence[RankReport], last_stage: int) -> MeasuredRun:
    """Account every rank's time (module docstring) and build the measured timeline."""
    produced = _compute_ends(reports)
    makespan = max((r.end_s for report in reports for r in report.records), default=0.0)
    stats, timeline = [], []
    for report in reports:
        rank_stats = RankStats(report.rank)
        for record in report.records:
            timeline.extend(_slices(record, produced))
            duration = record.end_s - record.start_s
            if record.is_compute:
                rank_stats.compute_s += duration
                rank_stats.num_computes += 1
            elif record.kind == "SEND_F":
                # Blocking: held from issue to completion; async: the posting only.
                rank_stats.exposed_pp_comm_s += duration
            else:
                ready = produced.get(record.key, record.start_s)
                rank_stats.exposed_pp_comm_s += max(0.0, record.end_s - max(record.start_s, ready))
            rank_stats.busy_until = max(rank_stats.busy_until, record.end_s)
        rank_stats.bubble_s = max(0.0, makespan - rank_stats.compute_s - rank_stats.exposed_comm_s)
        stats.append(rank_stats)
    arrivals = reports[0].arrivals_s
    # The requests each forward completes (``report.chunks`` rows are ``ChunkSpec`` fields).
    finishes = {(c[0], c[1]): ChunkSpec(*c).completed_requests for c in reports[0].chunks}
    ttft = {
        request: r.end_s - arrivals[request]
        for report in reports for r in report.records
        if r.is_compute and r.stage_index == last_stage
        for request in finishes.get((r.request_index, r.chunk_index), ())
    }
    cost = sum(r.cost_s for report in reports for r in report.records if r.is_compute)
    return MeasuredRun(makespan, stats, ttft, cost, len(reports[0].chunks), sorted(timeline, key=lambda s: (s.start, s.rank)))


def _slices(record: ActionRecord, produced: dict[tuple[int, int, int], float]) -> list[TimelineSlice]:
    """Trace slices of one record, in the simulator's vocabulary (``sim.entities.SliceKind``)."""
    common = dict(group=record.group, stage_index=record.stage_index, request_index=record.request_index,
                  chunk_index=record.chunk_index)
    if record.is_compute:
        return [TimelineSlice(record.rank, record.action, SliceKind.COMPUTE, record.start_s, record.end_s,
                              None, record.stage_index, record.request_index, record.chunk_index,
                              {"cpu_s": record.cost_s, "tokens": record.num_tokens, "prefix": record.prefix_len})]
    out = []
    if record.kind == "RECV_F":
        ready = min(max(record.start_s, produced.get(record.key, record.start_s)), record.end_s)
        if ready > record.start_s:
            out.append(TimelineSlice(record.rank, record.action, SliceKind.WAIT_DATA, record.start_s, ready, **common))
        if record.end_s > ready:
            out.append(TimelineSlice(record.rank, record.action, SliceKind.WAIT_COMM, ready, record.end_s, **common))
        return out
    posted = record.posted_s if record.posted_s is not None else record.start_s
    done = record.done_s if record.done_s is not None else record.end_s
    out.append(TimelineSlice(record.rank, record.action, SliceKind.SEND, posted, max(posted, done), **common))
    if record.end_s > record.start_s:
        out.append(TimelineSlice(record.rank, record.action, SliceKind.WAIT_COMM, record.start_s, record.end_s, **common))
    return out
