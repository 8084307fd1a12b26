"""A server's executed prefill computes, run on the simulator's engine with measured costs.

Why: on a machine whose PP ranks share CPU cores, a rank's wall clock includes the time the OS
gave to the other ranks, so wall-clock bubbles say nothing about a pipeline. Each stage compute's
thread CPU time is a good proxy for what it would take on a dedicated device. The records (the
plugin's ``--vpp-trace`` files, schema in ``trace_records``) are turned into a ``Schedule`` and
executed by the one discrete-event engine (``sim.simulate_schedule``), which decides nothing: it
only supplies time to the order every rank executed.

Data flow: prefill records of one measured window -> ``records_schedule`` (per-rank streams in
each rank's executed order, ``start_s``; stock cpp / dcpp record stage = rank on the contiguous
layout, the vpp modes the virtual stage on the fold-back one) -> engine with one of two costs ->
``WindowReplay`` (per rank: busy, idle inside the makespan, makespan; the compute spans a Gantt
chart draws).

How the streams read: the window is written as one request whose chunks are the window's
micro-batches in ``seq`` order (chunk ``k`` starts after the prefill tokens of the ``k`` before
it: the *chunk position* the shared cost model is keyed by). A compute whose previous stage of
the same micro-batch ran on another rank receives it first; sends leave right after the compute
(``async``); ``fwd`` carries hand-offs up the ranks, ``bwd`` down. A link's receives are posted in
the order its sender sent, as many as the consumer's next compute needs: the engine pairs the
i-th operations of both ends (as NCCL does), while the server's inbox takes messages by
``(stage, seq)``. Receiving an earlier message first adds no wait: with free transfers it was
ready no later than the one needed (its sender computed it earlier).

Transfers cost 0. Costs: each record's own ``cpu_s`` (one mode's timeline, with that mode's own
measuring noise and cache effects), or a ``SharedCostModel`` fitted on every mode's records
(``shared_cost_model``; ``runtime.equal_cost``, the model ``sglang-vpp bench``'s verdict uses), so
only the executed orders differ. A position only one mode ran keeps that mode's own samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..schedule import (
    ChunkSpec,
    CommSemantics,
    Layout,
    LayoutKind,
    Policy,
    RequestSpec,
    Schedule,
    StageCostModel,
    Fold,
    StageSpec,
    build_layout,
    compute,
    recv,
    send,
)
from ..schedule.controller import hand_off_group, hand_off_groups

if TYPE_CHECKING:
    from ..runtime.equal_cost import SharedCostModel
    from ..sim import SimResult

__all__ = ["IncompleteRecordsError", "RankTimeline", "Span", "WindowReplay", "records_schedule", "replay_window",
           "shared_cost_model"]

_NUM_GROUPS = 2
"""One group per direction (module docstring), whatever the mode recorded, stock cpp's one group
included: with free transfers and each link's receives posted in send order, a group only names
the direction of a link here."""
_GROUPS = hand_off_groups(_NUM_GROUPS)

Span = tuple[float, float, int, int]
"""(start, end, stage, seq) of one replayed compute."""


@dataclass(frozen=True, slots=True)
class RankTimeline:
    rank: int
    busy_s: float
    idle_s: float
    makespan_s: float

    @property
    def idle_fraction(self) -> float:
        return self.idle_s / self.makespan_s if self.makespan_s > 0 else 0.0


@dataclass(frozen=True)
class WindowReplay:
    ranks: list[RankTimeline]
    spans: dict[int, list[Span]]
    """Per rank, in time order (what ``plots.write_rank_gantt`` draws)."""


class IncompleteRecordsError(ValueError):
    """Records that cannot run: ranks wait in a cycle (a trace cut in the middle of a batch), a
    stage on a rank the layout does not give it, or one stage of a micro-batch recorded twice."""


def _positions(window: Sequence[dict]) -> dict[int, tuple[int, int]]:
    """Per micro-batch of ``window``: (prefill tokens before it in the window, its tokens; at
    least 1, the least a chunk holds, should a record say 0)."""
    tokens: dict[int, int] = {}
    for record in window:
        tokens.setdefault(record["seq"], max(1, int(record["num_tokens"])))
    out, before = {}, 0
    for seq in sorted(tokens):
        out[seq] = (before, tokens[seq])
        before += tokens[seq]
    return out


def _window_layout(window: Sequence[dict], num_ranks: int) -> Layout:
    """Contiguous when every stage index is a rank, else fold-back: fused when a stage past the
    fold ran on the rank the fused layout gives it (the two folds agree on the way down); one
    layer per stage (the records' own costs need no layer count)."""
    num_stages = max((r["stage"] for r in window), default=0) + 1
    if num_stages <= num_ranks:
        return build_layout(num_ranks, num_ranks, LayoutKind.CONTIGUOUS)
    split, fused = (build_layout(num_ranks, 2 * num_ranks, LayoutKind.FOLDBACK, fold=fold)
                    for fold in (Fold.SPLIT, Fold.FUSED))
    if any(_ran_where(fused, r) and not _ran_where(split, r) for r in window):
        return fused
    return split


def _ran_where(layout: Layout, record: dict) -> bool:
    """Whether ``layout`` gives ``record``'s stage the rank it ran on."""
    return 0 <= record["stage"] < layout.num_stages and layout.rank_of(record["stage"]) == record["rank"]


def records_schedule(window: Sequence[dict], num_ranks: int,
                     layout: Layout | None = None) -> tuple[Schedule, dict[int, int]]:
    """The streams ``window`` executed (module docstring) and each chunk index's ``seq``."""
    layout = layout if layout is not None else _window_layout(window, num_ranks)
    positions = _positions(window)
    seqs = sorted(positions)
    index = {seq: k for k, seq in enumerate(seqs)}
    done: set[tuple[int, int]] = set()
    for record in window:
        stage, rank = record["stage"], record["rank"]
        if (stage, record["seq"]) in done:
            raise IncompleteRecordsError(
                f"stage {stage} of micro-batch {record['seq']} is recorded twice (rank {rank}); each "
                "micro-batch runs each stage once: are the records of two servers in one directory?")
        done.add((stage, record["seq"]))
        if stage >= layout.num_stages or layout.rank_of(stage) != rank:
            where = f"rank {layout.rank_of(stage)}" if stage < layout.num_stages else "no rank"
            raise IncompleteRecordsError(
                f"record of micro-batch {record['seq']} ran stage {stage} on rank {rank}; the "
                f"{layout.kind} layout of {num_ranks} ranks gives it {where}: pass the mode's layout")
    ordered = sorted(window, key=lambda r: r["start_s"])
    # Per link (sender, receiver): the keys it carries, in the sender's executed order.
    links: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for record in ordered:
        stage, seq = record["stage"], record["seq"]
        if (stage + 1, seq) in done and layout.rank_of(stage + 1) != record["rank"]:
            links.setdefault((record["rank"], layout.rank_of(stage + 1)), []).append((stage, seq))
    received = {link: 0 for link in links}
    streams: list[list] = [[] for _ in range(layout.num_ranks)]
    for record in ordered:
        rank, stage, seq = record["rank"], record["stage"], record["seq"]
        source = layout.rank_of(stage - 1) if stage > 0 else rank
        if (stage - 1, seq) in done and source != rank:
            link = links[(source, rank)]
            group = hand_off_group(source, rank, _NUM_GROUPS)
            for key in link[received[(source, rank)] : link.index((stage - 1, seq)) + 1]:
                streams[rank].append(recv(key[0], 0, index[key[1]], source, group))
                received[(source, rank)] += 1
        streams[rank].append(compute(stage, 0, index[seq]))
        if (stage + 1, seq) in done and layout.rank_of(stage + 1) != rank:
            target = layout.rank_of(stage + 1)
            streams[rank].append(send(stage, 0, index[seq], target, hand_off_group(rank, target, _NUM_GROUPS)))
    chunks = tuple(ChunkSpec(0, k, positions[seq][0], positions[seq][1], k == len(seqs) - 1)
                   for k, seq in enumerate(seqs))
    length = sum(tokens for _, tokens in positions.values())
    schedule = Schedule(
        policy=Policy.CPP if layout.kind is LayoutKind.CONTIGUOUS else Policy.VPP,  # a label only
        layout=layout, chunks=chunks, rank_actions=tuple(tuple(s) for s in streams),
        comm_semantics=CommSemantics.ASYNC, groups=_GROUPS,
        requests=(RequestSpec(length),) if length else ())
    return schedule, dict(enumerate(seqs))


@dataclass(frozen=True)
class _RecordCosts(StageCostModel):
    """Each record's own ``cpu_s``, by (stage, chunk index); transfers free."""

    seconds: Mapping[tuple[int, int], float]

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.seconds[(stage.stage_index, chunk.chunk_index)]


@dataclass(frozen=True)
class _ComputeOnly(StageCostModel):
    """``model``'s compute costs with free transfers (what the server report assumes)."""

    model: StageCostModel

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.model.stage_cost(stage, chunk)


def replay_window(window: Sequence[dict], num_ranks: int, layout: Layout | None = None,
                  model: SharedCostModel | None = None) -> WindowReplay:
    """Run ``window``'s executed order on the engine: with each record's ``cpu_s``, or with
    ``model`` on ``layout`` (the mode's layout; needed for the layer counts)."""
    from ..sim import SimConfig, simulate_schedule

    if model is not None and layout is None:
        raise ValueError("replay_window: a shared cost model needs the mode's layout (layer counts); pass layout=")
    schedule, seq_of = records_schedule(window, num_ranks, layout)
    if model is not None:
        cost: StageCostModel = _ComputeOnly(model.for_layout(schedule.layout))
    else:
        index = {seq: k for k, seq in seq_of.items()}
        cost = _RecordCosts({(r["stage"], index[r["seq"]]): r["cpu_s"] for r in window})
    result = simulate_schedule(schedule, cost, SimConfig())
    if result.deadlock is not None:
        raise IncompleteRecordsError("records cannot be replayed: ranks wait in a cycle: "
                                     + result.deadlock.describe(schedule.rank_actions).splitlines()[0])
    return WindowReplay(_rank_timelines(result), _spans(result, seq_of))


def _rank_timelines(result: SimResult) -> list[RankTimeline]:
    end = result.makespan_s
    return [RankTimeline(rank=s.rank, busy_s=s.compute_s, idle_s=end - s.compute_s, makespan_s=end)
            for s in result.per_rank]


def _spans(result: SimResult, seq_of: Mapping[int, int]) -> dict[int, list[Span]]:
    spans: dict[int, list[Span]] = {}
    for s in result.timeline:
        if s.kind == "compute":
            spans.setdefault(s.rank, []).append((s.start, s.end, s.stage_index, seq_of[s.chunk_index]))
    return spans


def _samples(window: Sequence[dict], layout: Layout) -> list:
    from ..sim.cost.samples import CostSample

    positions = _positions(window)
    return [CostSample("compute", r["stage"], 0, 0, positions[r["seq"]][0], positions[r["seq"]][1], r["cpu_s"],
                       layout.stages[r["stage"]].num_layers, r["rank"]) for r in window]


def shared_cost_model(windows: Mapping[str, Sequence[Sequence[dict]]], layouts: Mapping[str, Layout],
                      fallback: SharedCostModel | None = None) -> SharedCostModel:
    """One cost model fitted on the measured windows of every mode (``{mode: [window, ...]}``)."""
    from ..runtime.equal_cost import MeasuredRunCosts, SharedCostModel

    runs = [MeasuredRunCosts(mode, layouts[mode], [s for window in mode_windows for s in _samples(window, layouts[mode])])
            for mode, mode_windows in windows.items()]
    return SharedCostModel.fit(runs, fallback=fallback)
