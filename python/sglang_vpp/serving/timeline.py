"""Dedicated-hardware timelines rebuilt from measured per-stage CPU times (pure Python).

Why: on a machine whose PP ranks share CPU cores, a rank's wall clock includes the time the OS
gave to the other ranks, so wall-clock bubbles say nothing about a pipeline. Each stage compute's
thread CPU time is a good proxy for what it would take on a dedicated device. This module replays
the computes with those durations and the pipeline's dependencies:

- a compute starts when its rank is free (computes keep the order the rank executed them in) and
  when the previous pipeline stage of the same micro-batch has finished (transfers cost 0 here);
- ``replay_executed``: any run as executed, from the plugin's records (``--vpp-trace``): stock
  cpp / dcpp record stage = rank, the vpp modes record the virtual stage;
- ``replay_as_contiguous``: fold-back records regrouped as stock CPP would place the same layers
  (rank r runs virtual stages 2r and 2r+1, one contiguous range; micro-batches in admission
  order), a what-if for one run.

A record is a dict with ``rank``, ``stage``, ``seq`` (micro-batch id, the same on every rank) and
``cpu_s``; ``start_s`` orders a rank's records. Output per rank: busy time, idle time inside the
makespan, and the makespan.

Which costs: each record's own ``cpu_s`` by default (one mode's timeline, with that mode's own
measuring noise and cache effects: the same layers cost a contiguous stage more than two fold-back
stages), or, to compare modes, ``shared_cost_model`` + ``equal_costs``: every mode's records
re-timed on ONE cost model fitted on all modes' records (``runtime.equal_cost.SharedCostModel``,
the model ``sglang-vpp bench``'s verdict uses), so only the executed orders differ. The records
carry no per-request prefix, so a micro-batch's chunk position is keyed by the prefill tokens
before it in its measured window: modes that ran the same micro-batches in the same order share
each position's per-layer cost; a position only one mode ran keeps that mode's own samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.equal_cost import SharedCostModel
    from ..schedule import Layout

__all__ = ["RankTimeline", "equal_costs", "executed_spans", "replay_executed", "replay_as_contiguous",
           "shared_cost_model"]

Cost = Callable[[dict], float]
"""Seconds a record's compute takes in the replay."""


def _own_cost(record: dict) -> float:
    return record["cpu_s"]


@dataclass(frozen=True, slots=True)
class RankTimeline:
    rank: int
    busy_s: float
    idle_s: float
    makespan_s: float

    @property
    def idle_fraction(self) -> float:
        return self.idle_s / self.makespan_s if self.makespan_s > 0 else 0.0


class IncompleteRecordsError(ValueError):
    """A record waits for a stage no record provides (a trace cut in the middle of a batch)."""


def _summarise(num_ranks: int, spans: dict[int, list[tuple[float, float]]]) -> list[RankTimeline]:
    end = max((e for rank_spans in spans.values() for _, e in rank_spans), default=0.0)
    out = []
    for rank in range(num_ranks):
        busy = sum(e - s for s, e in spans.get(rank, []))
        out.append(RankTimeline(rank=rank, busy_s=busy, idle_s=end - busy, makespan_s=end))
    return out


def replay_executed(records: list[dict], num_ranks: int, cost: Cost = _own_cost) -> list[RankTimeline]:
    """Replay measured records in each rank's executed order (module docstring)."""
    spans = executed_spans(records, num_ranks, cost)
    return _summarise(num_ranks, {rank: [(s, e) for s, e, _stage, _seq in items] for rank, items in spans.items()})


def executed_spans(records: list[dict], num_ranks: int,
                   cost: Cost = _own_cost) -> dict[int, list[tuple[float, float, int, int]]]:
    """Per rank: (start, end, stage, seq) of each replayed compute (what a Gantt chart draws)."""
    finish: dict[tuple[int, int], float] = {}
    free = [0.0] * num_ranks
    spans: dict[int, list[tuple[float, float, int, int]]] = {}
    ordered = sorted(records, key=lambda r: r["start_s"])
    queues = {rank: [r for r in ordered if r["rank"] == rank] for rank in range(num_ranks)}
    stages_of_seq: dict[int, set[int]] = {}
    for record in records:
        stages_of_seq.setdefault(record["seq"], set()).add(record["stage"])
    while any(queues.values()):
        progressed = False
        for rank, queue in queues.items():
            while queue:
                record = queue[0]
                dep = (record["stage"] - 1, record["seq"])
                if dep[0] in stages_of_seq[record["seq"]] and dep not in finish:
                    break
                start = max(free[rank], finish.get(dep, 0.0))
                end = start + cost(record)
                finish[(record["stage"], record["seq"])] = end
                free[rank] = end
                spans.setdefault(rank, []).append((start, end, record["stage"], record["seq"]))
                queue.pop(0)
                progressed = True
        if not progressed:
            stuck = {rank: f"{q[0]['stage']}F{q[0]['seq']}" for rank, q in queues.items() if q}
            raise IncompleteRecordsError(f"records cannot be replayed: ranks wait in a cycle at {stuck}")
    return spans


def replay_as_contiguous(records: list[dict], num_ranks: int) -> list[RankTimeline]:
    """Fold-back stage costs placed as stock CPP: rank r = virtual stages 2r and 2r+1."""
    cost: dict[tuple[int, int], float] = {}
    for record in records:
        rank = record["stage"] // 2
        cost[(rank, record["seq"])] = cost.get((rank, record["seq"]), 0.0) + record["cpu_s"]
    seqs = sorted({record["seq"] for record in records})
    free = [0.0] * num_ranks
    spans: dict[int, list[tuple[float, float]]] = {}
    for seq in seqs:
        ready = 0.0
        for rank in range(num_ranks):
            start = max(free[rank], ready)
            end = start + cost.get((rank, seq), 0.0)
            free[rank] = ready = end
            spans.setdefault(rank, []).append((start, end))
    return _summarise(num_ranks, spans)


def _positions(window: Sequence[dict]) -> dict[int, tuple[int, int]]:
    """Per micro-batch of ``window``: (prefill tokens before it in the window, its tokens)."""
    tokens: dict[int, int] = {}
    for record in window:
        tokens.setdefault(record["seq"], int(record["num_tokens"]))
    out, before = {}, 0
    for seq in sorted(tokens):
        out[seq] = (before, tokens[seq])
        before += tokens[seq]
    return out


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


def equal_costs(window: Sequence[dict], layout: Layout, model: SharedCostModel) -> Cost:
    """The cost of each record of ``window`` on the shared ``model`` (``replay_executed``'s ``cost``)."""
    positions = _positions(window)
    last = layout.num_stages - 1

    def cost(record: dict) -> float:
        prefix, tokens = positions[record["seq"]]
        stage = record["stage"]
        return model.compute(layout.stages[stage].num_layers, stage == 0, stage == last, prefix, tokens)

    return cost
