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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankTimeline", "executed_spans", "replay_executed", "replay_as_contiguous"]


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


def replay_executed(records: list[dict], num_ranks: int) -> list[RankTimeline]:
    """Replay measured records in each rank's executed order (module docstring)."""
    spans = executed_spans(records, num_ranks)
    return _summarise(num_ranks, {rank: [(s, e) for s, e, _stage, _seq in items] for rank, items in spans.items()})


def executed_spans(records: list[dict], num_ranks: int) -> dict[int, list[tuple[float, float, int, int]]]:
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
                end = start + record["cpu_s"]
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
