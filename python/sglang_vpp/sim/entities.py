"""Small value types the engine produces: timeline slices and per-rank time accounts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean
from enum import StrEnum

__all__ = ["SliceKind", "TimelineSlice", "RankStats", "bubble_ratio", "mean_ttft_s"]


class SliceKind(StrEnum):
    COMPUTE = "compute"
    """A stage computing a chunk (includes the stage's exposed TP collectives, see ``args``)."""
    SEND = "send"
    """A transfer on a communicator, seen from the sending rank (start to end of the copy)."""
    RECV = "recv"
    """The same transfer seen from the receiving rank."""
    WAIT_COMM = "wait_comm"
    """A rank held by a comm action after its data was produced: exposed communication."""
    WAIT_DATA = "wait_data"
    """A rank held by a receive whose data is not produced yet, or by a blocking send whose
    receiver has not posted (a rendezvous): bubble."""


@dataclass(frozen=True, slots=True)
class TimelineSlice:
    """One interval on one rank's track. ``group`` is the comm group (None for compute)."""

    rank: int
    action: str
    """Action text (``3F1.0``, ``0SEND_F1.0>1@fwd``) as in ``sglang_vpp.schedule.ir``."""
    kind: SliceKind
    start: float
    end: float
    group: str | None = None
    stage_index: int = -1
    request_index: int = -1
    chunk_index: int = -1
    args: dict = field(default_factory=dict)
    """Extra numbers for traces: for compute, ``compute_s``, ``tp_comm_s``, ``overhead_s``."""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {
            "rank": self.rank, "action": self.action, "kind": str(self.kind), "start": self.start,
            "end": self.end, "group": self.group, "stage": self.stage_index,
            "request": self.request_index, "chunk": self.chunk_index, **({"args": self.args} if self.args else {}),
        }


@dataclass(slots=True)
class RankStats:
    """Where one rank's time went, over ``[first arrival, makespan]`` (see docs/metrics.md).

    ``compute_s + exposed_comm_s + bubble_s == makespan - first arrival`` for every rank.
    """

    rank: int
    compute_s: float = 0.0
    """Device busy with stage math (FLOPs and memory traffic)."""
    exposed_tp_comm_s: float = 0.0
    """Tensor-parallel collectives inside stage computes that are not overlapped with math."""
    exposed_pp_comm_s: float = 0.0
    """Waiting on a pipeline send/receive after the data it carries was produced."""
    bubble_s: float = 0.0
    """Idle: waiting for data not produced yet, for a request to arrive, host overhead, drain."""
    overhead_s: float = 0.0
    """Per-chunk host overhead inside stage slices (device idle); part of ``bubble_s``."""
    busy_until: float = 0.0
    """End of this rank's last action."""
    num_computes: int = 0
    idle_by_cause: dict[str, float] = field(default_factory=dict)
    """``bubble_s`` split by mechanism (``sim.idle.IdleCause``); the values add up to ``bubble_s``."""

    @property
    def exposed_comm_s(self) -> float:
        return self.exposed_tp_comm_s + self.exposed_pp_comm_s

    def to_dict(self) -> dict:
        return {
            "rank": self.rank, "compute_s": self.compute_s, "bubble_s": self.bubble_s,
            "exposed_comm_s": self.exposed_comm_s, "exposed_tp_comm_s": self.exposed_tp_comm_s,
            "exposed_pp_comm_s": self.exposed_pp_comm_s, "overhead_s": self.overhead_s,
            "busy_until": self.busy_until, "num_computes": self.num_computes,
            "idle_by_cause_s": dict(self.idle_by_cause),
        }


def bubble_ratio(per_rank: Sequence[RankStats], span_s: float) -> float:
    """Idle share of all rank-time: sum of bubbles / (ranks * span), ``span_s`` the time the ranks'
    stats cover (from the first arrival to the makespan; docs/metrics.md); the simulator and the
    measured runtime report it alike."""
    if span_s <= 0 or not per_rank:
        return 0.0
    return sum(r.bubble_s for r in per_rank) / (len(per_rank) * span_s)


def mean_ttft_s(request_ttft_s: Mapping[int, float]) -> float:
    """Mean time to first token over requests (0 for none)."""
    return fmean(request_ttft_s.values()) if request_ttft_s else 0.0
