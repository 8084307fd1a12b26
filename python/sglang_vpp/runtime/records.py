"""What a rank measures and reports: one ``ActionRecord`` per executed action, one ``RankReport`` per rank.

Clock: every wall time is ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, shared by all
processes of the host) minus the run epoch the launcher hands to every rank, so records of
different ranks lie on one time axis. ``cost_s`` is the compute's own cost: the rank thread's CPU
time on CPU (``time.thread_time``, one intra-op thread per rank so it covers all the work), the
synchronised device time on GPU/NPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["ActionRecord", "RankReport"]


@dataclass(slots=True)
class ActionRecord:
    """One executed action on one rank (times in seconds after the run epoch)."""

    rank: int
    index: int
    """Position in the rank's executed stream."""
    action: str
    """Text form, e.g. ``3F1.0``, ``0SEND_F1.0>1@fwd``."""
    kind: str
    """``F``, ``SEND_F`` or ``RECV_F``."""
    stage_index: int
    request_index: int
    chunk_index: int
    start_s: float
    """The rank reached the action."""
    end_s: float
    """The rank moved on (a compute finished, a receive delivered, a send was posted or, when
    blocking, completed)."""
    cost_s: float = 0.0
    """Compute only: thread CPU seconds (CPU) or device seconds (GPU/NPU)."""
    num_tokens: int = 0
    prefix_len: int = 0
    posted_s: float | None = None
    """Comm only: when the operation was handed to the communicator (early for pre-posted receives)."""
    done_s: float | None = None
    """Comm only: when the transfer finished (the channel's completion callback)."""
    group: str | None = None
    peer: int | None = None

    @property
    def is_compute(self) -> bool:
        return self.kind == "F"

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.stage_index, self.request_index, self.chunk_index)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RankReport:
    """Everything one rank sends back to the launcher."""

    rank: int
    pid: int
    records: list[ActionRecord] = field(default_factory=list)
    executed: list[str] = field(default_factory=list)
    """The rank's executed action stream (text), in order."""
    chunks: list[tuple] = field(default_factory=list)
    """(request, chunk, start, num_tokens, is_last, batch) of every forward, the ``ChunkSpec``
    fields, in the planner's sequence order (rank 0 only; followers hold the same)."""
    lengths: list[int] = field(default_factory=list)
    arrivals_s: list[float] = field(default_factory=list)
    outputs_path: str | None = None
    """torch file ``{request: (hidden [n, H], logits [V])}`` (the rank holding the last stage)."""
    ready_s: float = 0.0
    """When the rank finished start-up (model built, communicator up), after the epoch."""
    finished_s: float = 0.0
    """When its last action ended (before draining pending sends)."""
    drained_s: float = 0.0
    peak_kv_bytes: int = 0
    num_parameters: int = 0
