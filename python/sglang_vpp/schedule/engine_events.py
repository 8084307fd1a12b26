"""Engine events: each ``handle`` advances the engine and returns the events it causes.

The heap loop in ``engine.py`` pops the earliest event and pushes what its handler returns
(Vidur's shape). Two events suffice to execute given streams: a rank becoming free to issue its
next action, and a transfer finishing (which frees the ranks held by its send or receive). A
live run (the engine asking the planner as it goes) adds two: a compute ending (the planner
learns it before the rank goes on) and a wake-up at a time the planner has something to decide
(an arrival, or work a what-if's fork left in flight ending).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine
    from .links import Link

__all__ = ["ComputeDoneEvent", "Event", "PlanEvent", "RankReadyEvent", "TransferDoneEvent"]


@dataclass(slots=True)
class Event:
    time: float

    def handle(self, engine: "Engine") -> list["Event"]:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(slots=True)
class RankReadyEvent(Event):
    """``rank`` has finished its previous action and issues the next ones."""

    rank: int

    def handle(self, engine: "Engine") -> list[Event]:
        return engine.issue(self.rank, self.time)


@dataclass(slots=True)
class TransferDoneEvent(Event):
    """Transfer ``index`` on ``link`` has ended; wake the ranks it held."""

    link: "Link"
    index: int

    def handle(self, engine: "Engine") -> list[Event]:
        return engine.finish_transfer(self.link, self.index, self.time)


@dataclass(slots=True)
class ComputeDoneEvent(Event):
    """Live runs: ``rank``'s compute has ended; report it, then issue the rank's next actions."""

    rank: int

    def handle(self, engine: "Engine") -> list[Event]:
        return engine.compute_done(self.rank, self.time)


@dataclass(slots=True)
class PlanEvent(Event):
    """Live runs: the planner has a decision due at this time: the engine asks it after this
    instant."""

    def handle(self, engine: "Engine") -> list[Event]:
        return engine.wake()
