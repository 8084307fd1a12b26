"""Dedicated-hardware timelines rebuilt from measured per-stage CPU times (pure Python).

Why: on a machine whose PP ranks share CPU cores, a rank's wall clock includes the time the OS
gave to the other ranks, so wall-clock bubbles say nothing about a pipeline. Each stage compute's
thread CPU time is a good proxy for what it would take on a dedicated device. This module replays
the computes with those durations and the pipeline's dependencies:

- a compute starts when its rank is free (computes keep the order the rank executed them in) and
  when the previous virtual stage of the same micro-batch has finished (transfers cost 0 here);
- ``replay_foldback``: the VPP run as executed (records of ``accounting.py``);
- ``replay_contiguous``: the same micro-batches and the same per-stage costs regrouped as stock
  CPP would place them (rank r runs the layers of virtual stages 2r and 2r+1, one contiguous
  range; micro-batches in admission order).

Output per rank: busy time, idle time inside the makespan, and the makespan.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RankTimeline", "replay_foldback", "replay_contiguous"]


@dataclass(frozen=True, slots=True)
class RankTimeline:
    rank: int
    busy_s: float
    idle_s: float
    makespan_s: float


def _summarise(num_ranks: int, spans: dict[int, list[tuple[float, float]]]) -> list[RankTimeline]:
    end = max((e for rank_spans in spans.values() for _, e in rank_spans), default=0.0)
    out = []
    for rank in range(num_ranks):
        busy = sum(e - s for s, e in spans.get(rank, []))
        out.append(RankTimeline(rank=rank, busy_s=busy, idle_s=end - busy, makespan_s=end))
    return out


def replay_foldback(records: list[dict], num_ranks: int) -> list[RankTimeline]:
    """Replay VPP records (dicts with rank, stage, seq, start_s, cpu_s) in executed order."""
    finish: dict[tuple[int, int], float] = {}
    free = [0.0] * num_ranks
    spans: dict[int, list[tuple[float, float]]] = {}
    pending = sorted(records, key=lambda r: (r["start_s"], r["rank"]))
    queues = {rank: [r for r in pending if r["rank"] == rank] for rank in range(num_ranks)}
    while any(queues.values()):
        progressed = False
        for rank, queue in queues.items():
            while queue:
                record = queue[0]
                dep = (record["stage"] - 1, record["seq"])
                if record["stage"] > 0 and dep not in finish:
                    break
                start = max(free[rank], finish.get(dep, 0.0))
                end = start + record["cpu_s"]
                finish[(record["stage"], record["seq"])] = end
                free[rank] = end
                spans.setdefault(rank, []).append((start, end))
                queue.pop(0)
                progressed = True
        assert progressed, "records have a dependency cycle (incomplete trace?)"
    return _summarise(num_ranks, spans)


def replay_contiguous(records: list[dict], num_ranks: int) -> list[RankTimeline]:
    """The same stage costs placed as stock CPP: rank r = virtual stages 2r and 2r+1."""
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
