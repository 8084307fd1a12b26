"""``SimConfig``: how the engine executes comm actions. Constructing it touches nothing."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SimError

__all__ = ["SimConfig"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Execution semantics of the simulator (see ``engine.py`` for the model)."""

    prepost_recvs: bool | None = None
    """Whether receives are posted ahead of time (``irecv`` issued as early as the communicator's
    order allows), so a transfer can run while the receiver still computes. ``None`` follows the
    schedule: on for ``async`` schedules (SGLang-style posted transfers), off for ``blocking``
    ones (a receive is posted when the rank reaches it: a rendezvous)."""
    record_timeline: bool = True
    """Keep one ``TimelineSlice`` per compute, transfer and exposed wait (for traces and plots).
    Sweeps turn it off to save memory and time."""
    check_deadlock: bool = True
    """Dry-run ``sglang_vpp.schedule.check_deadlock`` first; a deadlock is reported in
    ``SimResult.deadlock`` (or raised, see ``raise_on_deadlock``) instead of simulated."""
    raise_on_deadlock: bool = False
    """Raise ``SimDeadlockError`` instead of returning a result with ``deadlock`` set."""

    def __post_init__(self) -> None:
        if self.prepost_recvs not in (None, True, False):
            raise SimError(f"prepost_recvs must be None, True or False, got {self.prepost_recvs!r}")
