"""``SimResult``: what one simulated schedule produced (definitions in docs/metrics.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

from ..schedule import DeadlockReport
from .entities import RankStats, TimelineSlice, bubble_ratio, mean_ttft_s

__all__ = ["SimResult"]


@dataclass
class SimResult:
    """Times in seconds on the simulated clock (0 = first possible start)."""

    policy: str
    num_ranks: int
    makespan_s: float
    """End of the last action on any rank or communicator."""
    per_rank: list[RankStats]
    """Each rank's time over ``[start_s, makespan_s]``."""
    request_ttft_s: dict[int, float]
    """Per request: completion of its last chunk's last stage minus its release."""
    request_finish_s: dict[int, float] = field(default_factory=dict)
    request_release_s: dict[int, float] = field(default_factory=dict)
    """When each request could start: its arrival, or its gate's completion (closed loop)."""
    steps: int = 0
    """Forward launches on rank 0 (one per stage-chunk compute): the scheduler's iterations."""
    num_chunks: int = 0
    num_transfers: int = 0
    num_tokens: int = 0
    stage_totals_s: tuple[float, ...] = ()
    """Total stage time (compute + exposed TP + overhead) per virtual stage."""
    timeline: list[TimelineSlice] = field(default_factory=list)
    deadlock: DeadlockReport | None = None
    """Set when the schedule deadlocks; the times then cover only what ran."""
    start_s: float = 0.0
    """The first request's arrival, where the per-rank accounting (compute, comm, bubble) begins:
    idling before any request exists is no bubble of the schedule."""

    @property
    def ok(self) -> bool:
        return self.deadlock is None

    @property
    def compute_s(self) -> float:
        """Mean over ranks (the paper's profiler breakdown is per rank)."""
        return fmean(r.compute_s for r in self.per_rank) if self.per_rank else 0.0

    @property
    def bubble_s(self) -> float:
        return fmean(r.bubble_s for r in self.per_rank) if self.per_rank else 0.0

    @property
    def exposed_comm_s(self) -> float:
        return fmean(r.exposed_comm_s for r in self.per_rank) if self.per_rank else 0.0

    @property
    def idle_by_cause(self) -> dict[str, float]:
        """Bubble split by cause (``sim.idle``), mean over ranks like ``bubble_s``."""
        if not self.per_rank:
            return {}
        causes = dict.fromkeys(k for r in self.per_rank for k in r.idle_by_cause)
        return {k: fmean(r.idle_by_cause.get(k, 0.0) for r in self.per_rank) for k in causes}

    @property
    def bubble_ratio(self) -> float:
        return bubble_ratio(self.per_rank, self.makespan_s - self.start_s)

    @property
    def ttft_s(self) -> float:
        return mean_ttft_s(self.request_ttft_s)

    @property
    def throughput_tok_s(self) -> float:
        """Prompt tokens prefilled per second from the first arrival to the makespan."""
        span = self.makespan_s - self.start_s
        return self.num_tokens / span if span > 0 else 0.0

    @classmethod
    def deadlocked(cls, schedule, report: DeadlockReport) -> "SimResult":
        return cls(policy=str(schedule.policy), num_ranks=schedule.num_ranks, makespan_s=0.0,
                   per_rank=[RankStats(r) for r in range(schedule.num_ranks)], request_ttft_s={},
                   num_chunks=len(schedule.chunks), deadlock=report)

    def to_dict(self, timeline: bool = False) -> dict:
        data = {
            "policy": self.policy, "num_ranks": self.num_ranks, "makespan_s": self.makespan_s, "start_s": self.start_s,
            "ttft_s": self.ttft_s, "throughput_tok_s": self.throughput_tok_s,
            "compute_s": self.compute_s, "bubble_s": self.bubble_s, "exposed_comm_s": self.exposed_comm_s,
            "bubble_ratio": self.bubble_ratio, "idle_by_cause_s": self.idle_by_cause, "steps": self.steps, "num_chunks": self.num_chunks,
            "num_transfers": self.num_transfers, "num_tokens": self.num_tokens,
            "per_rank": [r.to_dict() for r in self.per_rank],
            "request_ttft_s": {str(k): v for k, v in sorted(self.request_ttft_s.items())},
            "deadlock": self.deadlock.to_dict() if self.deadlock else None,
        }
        if timeline:
            data["timeline"] = [s.to_dict() for s in self.timeline]
        return data
