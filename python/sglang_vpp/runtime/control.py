"""The control plane: every rank runs a replica of the online ``Planner``; rank 0 drives them all.

Why replicas: like SGLang's replicated schedulers, each rank derives its own action stream from
the same decisions instead of receiving per-action instructions. Determinism does the rest: the
schedule core's ``Planner`` is a pure function of the sequence of calls made on it, so ranks that
apply the same ops in the same order hold the same streams.

Data flow::

    request source (real arrival times)
        -> rank 0 ``CoordinatorFeed``: decides ops   Submit(length, arrival)  /  Advance(until)  /  End
              applies each op to its planner, then sends it to every follower (host-local queues)
        -> ranks 1.. ``FollowerFeed``: apply the same ops in the same order
        -> each rank: ``planner.take_new_actions(rank)`` -> its queue -> ``next_action()``

Rank 0 plans lazily: it steps the planner one estimated event at a time until its own queue holds
``lookahead`` actions (or nothing is left to plan). A request that arrives while others run is
submitted at the planner's current time, so it can fill the pipeline behind the work already
planned (and ``vpp-pack`` can pack it into a drain window) instead of waiting for everything
planned to finish. Followers never need an op that rank 0 has not sent yet: every action a
follower waits for data on was planned in the same step as its producer (send and receive are
emitted together or the send first), and rank 0 broadcasts an op before executing what it planned.

The control transport is a host-local ``multiprocessing`` queue per follower (the launcher starts
every rank on one host): the activations travel over the comm abstraction, the small ops do not.
``StaticFeed`` replays a precomputed ``Schedule`` instead (tests, offline plans).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..schedule import (
    Action,
    ChunkSpec,
    ControllerConfig,
    Layout,
    Planner,
    RequestSpec,
    Schedule,
    controller_config,
)
from ..schedule.auto_size import LiveSituation
from .spec import RunSpec

__all__ = ["Advance", "CoordinatorFeed", "End", "FollowerFeed", "Heartbeat", "PlanFeed", "Sent", "StaticFeed", "Submit",
           "make_planner", "run_controller_config"]

_HEARTBEAT_S = 1.0


@dataclass(frozen=True, slots=True)
class Submit:
    length: int
    planner_arrival: float
    """The planner-clock time the request is submitted at (rank 0's ``planner.now``)."""
    arrival_s: float
    """Real arrival, seconds after the run epoch (for TTFT and the replay)."""


@dataclass(frozen=True, slots=True)
class Sent:
    """The requests of the next ``Submit`` ops arrived together (index, prompt length): what the
    controller's ``auto`` chunker sizes for (``auto_size.LiveSituation``)."""

    requests: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Advance:
    until: float


@dataclass(frozen=True, slots=True)
class End:
    pass


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Rank 0 is alive but idle (waiting for an arrival); resets the followers' control timeout."""


Op = Submit | Sent | Advance | End | Heartbeat


def run_controller_config(spec: RunSpec, layout: Layout) -> ControllerConfig:
    """The controller configuration every rank builds identically from the spec."""
    # With ``batch_requests`` whole short requests share a forward up to the chunk size, as
    # SGLang's prefill adder fills a batch (the model runs attention per request).
    return controller_config(spec.mode, layout, spec.chunk_size, spec.planner_cost,  # type: ignore[arg-type]
                             spec.max_length, batching=spec.batch_requests, auto_chunk=spec.auto_chunk)


def make_planner(spec: RunSpec, layout: Layout) -> Planner:
    """The planner every rank builds identically from the spec."""
    return Planner(run_controller_config(spec, layout))


class PlanFeed(ABC):
    """Where a rank's actions come from; also the chunk and request facts they refer to."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.queue: deque[Action] = deque()
        self.executed: list[Action] = []
        self.chunks: dict[tuple[int, int], ChunkSpec] = {}
        self.lengths: list[int] = []
        self.arrivals_s: list[float] = []

    @abstractmethod
    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
        """The next action of this rank, or None when the run is over. ``should_abort`` raises if
        the run was aborted (called while waiting)."""

    def upcoming(self) -> Sequence[Action]:
        """Actions already known and not yet returned (for pre-posting receives)."""
        return self.queue

    def _take(self) -> Action:
        action = self.queue.popleft()
        self.executed.append(action)
        return action


class _PlannerFeed(PlanFeed):
    def __init__(self, rank: int, planner: Planner) -> None:
        super().__init__(rank)
        self.planner = planner
        self.situation = LiveSituation(planner)
        self.ended = False

    def apply(self, op: Op) -> None:
        if isinstance(op, Sent):
            self.situation.sent([RequestSpec(length, self.planner.now) for _, length in op.requests])
        elif isinstance(op, Submit):
            index = self.planner.submit(RequestSpec(op.length, op.planner_arrival))
            assert index == len(self.lengths), (index, len(self.lengths))
            self.lengths.append(op.length)
            self.arrivals_s.append(op.arrival_s)
        elif isinstance(op, Advance):
            self.planner.advance(until=op.until)
        elif isinstance(op, End):
            self.ended = True
        if not isinstance(op, Heartbeat):
            # Stage 0 may have batched queued requests into a forward: their chunks left the sequence.
            self.chunks = {chunk.key: chunk for chunk in self.planner.sequence}
        self.queue.extend(self.planner.take_new_actions(self.rank))


class CoordinatorFeed(_PlannerFeed):
    """Rank 0: turns real arrivals into planner ops, applies them, sends them to the followers."""

    def __init__(
        self,
        planner: Planner,
        requests: Sequence[tuple[int, float]],
        followers: Sequence[Any],
        epoch: float,
        lookahead: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(0, planner)
        self._pending = sorted(requests, key=lambda r: r[1])  # (length, arrival_s)
        self._followers = list(followers)
        self._epoch = epoch
        self._lookahead = lookahead
        self._clock = clock
        self._last_sent = clock()

    def _broadcast(self, op: Op) -> None:
        self.apply(op)
        for queue in self._followers:
            queue.put(op)
        self._last_sent = self._clock()

    def _admit_arrivals(self) -> None:
        now_s = self._clock() - self._epoch
        arrived = []
        while self._pending and self._pending[0][1] <= now_s:
            arrived.append(self._pending.pop(0))
        if not arrived:
            return
        first = len(self.lengths)
        self._broadcast(Sent(tuple((first + i, length) for i, (length, _) in enumerate(arrived))))
        for length, arrival_s in arrived:
            self._broadcast(Submit(length, self.planner.now, arrival_s))

    def _plan_more(self) -> bool:
        """One planning step; False when every known decision is made."""
        before = self._num_planned()
        self._broadcast(Advance(self.planner.now))  # settle decisions due now (e.g. after a submit)
        if self._num_planned() > before:
            return True
        # The schedule core has no public "next event" yet; its private helper is exact.
        upcoming = self.planner.next_event_time()
        if upcoming is None:
            return False
        self._broadcast(Advance(upcoming))
        return True

    def _num_planned(self) -> int:
        return sum(len(self.planner.rank_actions(r)) for r in range(self.planner.config.layout.num_ranks))

    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
        while True:
            should_abort()
            self._admit_arrivals()
            while len(self.queue) < self._lookahead and self._plan_more():
                self._admit_arrivals()
            if self.queue:
                return self._take()
            if not self._pending:
                if not self.ended:
                    self._broadcast(End())
                return None
            # Idle until the next arrival; keep the followers' control timeout from firing.
            wait = self._pending[0][1] - (self._clock() - self._epoch)
            if self._clock() - self._last_sent >= _HEARTBEAT_S:
                for queue in self._followers:
                    queue.put(Heartbeat())
                self._last_sent = self._clock()
            time.sleep(min(max(wait, 0.0), 0.05))


class FollowerFeed(_PlannerFeed):
    """Ranks 1..P-1: apply rank 0's ops in order; block (bounded) when out of actions."""

    def __init__(self, rank: int, planner: Planner, queue: Any, timeout_s: float) -> None:
        super().__init__(rank, planner)
        self._queue = queue
        self._timeout_s = timeout_s

    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
        import queue as queue_module

        silent_since = time.monotonic()
        while not self.queue:
            if self.ended:
                return None
            should_abort()
            try:
                op = self._queue.get(timeout=0.25)
            except queue_module.Empty:
                if time.monotonic() - silent_since > self._timeout_s:
                    raise TimeoutError(
                        f"rank {self.rank}: no planning op from rank 0 for {self._timeout_s:.0f}s while "
                        f"waiting for the next action (after {len(self.executed)} actions); rank 0 is stuck "
                        "or dead. Fix: read rank 0's error; raise Timeouts.control_s for very long computes"
                    ) from None
                continue
            silent_since = time.monotonic()
            self.apply(op)
        return self._take()


class StaticFeed(PlanFeed):
    """Replays one rank's stream of a precomputed ``Schedule`` (all requests known up front)."""

    def __init__(self, rank: int, schedule: Schedule, arrivals_s: Sequence[float] | None = None) -> None:
        super().__init__(rank)
        self.queue.extend(schedule.rank_actions[rank])
        self.chunks = {c.key: c for c in schedule.chunks}
        self.lengths = [r.length for r in schedule.requests]
        self.arrivals_s = list(arrivals_s) if arrivals_s is not None else [0.0] * len(self.lengths)

    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
        should_abort()
        return self._take() if self.queue else None
