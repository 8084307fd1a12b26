"""The dedicated-hardware replay: the executed action order, re-timed with the measured costs.

Why: the ranks of a CPU run share two vCPUs, so the wall clock shows time slicing, not pipeline
behaviour. What each compute *cost* is measured exactly (thread CPU time); the order every rank
executed is known. Replaying that order through the simulator's clock with those costs gives the
timeline the same run would have on hardware where every rank has its own core: the
**replayed (dedicated-hardware) timeline**, always labelled as such.

Data flow: ``RankReport``\\ s -> ``executed_schedule`` (a ``Schedule`` whose per-rank streams are
exactly what ran, whose requests arrive at their measured arrival times) and ``cost_samples``
(one ``CostSample`` per compute: thread CPU seconds; per hand-off: from both ends posted to
delivery) -> ``sim.TableCostModel`` (exact per action) -> ``sim.simulate_schedule`` ->
``SimResult`` (makespan, per-rank compute / exposed comm / bubble, TTFT, timeline).

The samples are written in the simulator's cost-samples format (``write_samples``), which
``sim.fit_cost_model`` reads: the calibration loop from a measured run to a fitted model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..schedule import (
    Action,
    ChunkSpec,
    Layout,
    RequestSpec,
    Schedule,
    get_policy,
    validate_schedule,
)
from ..schedule.controller import hand_off_groups
from ..sim import SimConfig, SimResult, simulate_schedule
from ..sim.cost.samples import CostSample, write_samples
from ..sim.cost.table import TableCostModel
from ..sim.entities import TimelineSlice
from ..sim.trace import write_gantt_png, write_perfetto_trace
from .records import RankReport
from .spec import RunSpec

__all__ = [
    "MEASURED_LABEL",
    "REPLAY_LABEL",
    "ReplayResult",
    "cost_samples",
    "executed_schedule",
    "replay_cost",
    "replay_run",
    "replay_samples",
    "write_cost_samples",
    "write_traces",
]

MEASURED_LABEL = "measured wall clock (ranks share this host's CPUs)"
REPLAY_LABEL = "replayed on dedicated hardware (measured per-action compute costs)"


@dataclass
class ReplayResult:
    schedule: Schedule
    samples: list[CostSample]
    result: SimResult


def executed_schedule(spec: RunSpec, layout: Layout, reports: Sequence[RankReport]) -> Schedule:
    """The streams that ran, as a ``Schedule`` the simulator can execute."""
    policy = get_policy(spec.mode)
    head = reports[0]
    chunks = tuple(ChunkSpec(*row) for row in head.chunks)
    groups = hand_off_groups(policy.num_groups)
    return Schedule(
        policy=policy.name,
        layout=layout,
        chunks=chunks,
        rank_actions=tuple(tuple(Action.parse(a) for a in report.executed) for report in reports),
        comm_semantics=policy.comm_semantics,
        groups=groups,
        requests=tuple(RequestSpec(length, arrival) for length, arrival in zip(head.lengths, head.arrivals_s)),
    )


def cost_samples(layout: Layout, reports: Sequence[RankReport]) -> list[CostSample]:
    """One compute sample per stage compute (its own cost) and one transfer sample per hand-off."""
    samples: list[CostSample] = []
    sends = {(r.key, r.rank): r for report in reports for r in report.records if r.kind == "SEND_F"}
    chunks = {(row[0], row[1]): ChunkSpec(*row) for row in reports[0].chunks}
    for report in reports:
        for record in report.records:
            if record.is_compute:
                stage = layout.stages[record.stage_index]
                # A record counts the whole forward's tokens; a sample names the lead's and the rest.
                lead = chunks[(record.request_index, record.chunk_index)]
                samples.append(CostSample("compute", record.stage_index, record.request_index, record.chunk_index,
                                          lead.start, lead.num_tokens, record.cost_s, stage.num_layers, record.rank,
                                          tuple((part.start, part.num_tokens) for part in lead.batch)))
            elif record.kind == "RECV_F":
                send = sends.get((record.key, record.peer))
                if send is None:
                    continue
                both_posted = max(send.posted_s or send.start_s, record.posted_s or record.start_s)
                done = record.done_s if record.done_s is not None else record.end_s
                chunk = chunks[(record.request_index, record.chunk_index)]
                samples.append(CostSample("transfer", record.stage_index, record.request_index, record.chunk_index,
                                          chunk.start, chunk.total_tokens,
                                          max(0.0, done - both_posted), None, send.rank))
    return samples


def replay_samples(samples: Sequence[CostSample]) -> list[CostSample]:
    """The samples the replay uses: computes as measured; every transfer replaced by the *least
    contended* measured transfer of the same size.

    A measured transfer on this host includes the time slices in which neither rank's channel
    thread got a CPU (both ranks compute on two shared vCPUs); the smallest observation of a
    message size is the closest to what the link itself costs, which is what dedicated hardware
    would see. Compute costs need no such correction: thread CPU time excludes time slicing.
    """
    fastest: dict[int, float] = {}
    for sample in samples:
        if sample.kind == "transfer":
            fastest[sample.num_tokens] = min(sample.duration_s, fastest.get(sample.num_tokens, float("inf")))
    return [replace(s, duration_s=fastest[s.num_tokens]) if s.kind == "transfer" else s for s in samples]


def replay_cost(samples: Sequence[CostSample]) -> TableCostModel:
    """Exact per-action costs for the replay (``replay_samples``)."""
    return TableCostModel.fit(replay_samples(samples))


def replay_run(spec: RunSpec, layout: Layout, reports: Sequence[RankReport]) -> ReplayResult:
    """Re-time the executed order with its own measured costs (module docstring)."""
    schedule = executed_schedule(spec, layout, reports)
    # The recorded streams, checked as the dry run's were before the run: complete, causal and
    # paired (here), and free of deadlock under rendezvous semantics (the simulator's dry run).
    validate_schedule(schedule)
    samples = cost_samples(layout, reports)
    cost = replay_cost(samples)
    arrivals = {i: a for i, a in enumerate(reports[0].arrivals_s)}
    result = simulate_schedule(schedule, cost, SimConfig(raise_on_deadlock=True), arrivals=arrivals)
    return ReplayResult(schedule, samples, result)


def write_traces(path_trace: str | Path | None, path_plot: str | Path | None,
                 timelines: Mapping[str, Sequence[TimelineSlice] | SimResult], title: str | None = None) -> None:
    """Perfetto trace and Gantt PNG of labelled timelines (measured and replayed, per mode)."""
    if path_trace is not None:
        write_perfetto_trace(dict(timelines), path_trace)
    if path_plot is not None:
        write_gantt_png(dict(timelines), path_plot, title=title)


def write_cost_samples(samples: Sequence[CostSample], path: str | Path, meta: dict | None = None) -> None:
    """Measured costs in the simulator's samples format (``.json`` or ``.csv``)."""
    write_samples(samples, path, meta)
