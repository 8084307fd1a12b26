"""The control plane: every rank runs a replica of the online ``Planner``; rank 0 drives them all.

Why replicas: like SGLang's replicated schedulers, each rank derives its own action stream from
the same decisions instead of receiving per-action instructions. Determinism does the rest: the
schedule core's ``Planner`` is a pure function of the sequence of calls made on it, so ranks that
apply the same ops in the same order hold the same streams.

Data flow::

    request source (real arrival times)          every rank's executor: done(t) after each action
        -> rank 0 ``CoordinatorFeed`` (control thread): decides ops
              Sent / Submit(length, arrival) / Done(rank, t) / Advance(real now) / End / Heartbeat
              applies each op to its planner, then sends it to every follower (host-local queues)
        -> ranks 1.. ``FollowerFeed``: apply the same ops in the same order
        -> each rank: ``planner.take_new_actions(rank)`` -> its queue -> ``next_action()``

The planner has no clock of its own (``Planner``): every action it
emits is in flight until its rank reports it done, and it decides from the reported times (an
async send counts as done once posted). Nothing is planned ahead on an estimate: a request that
arrives while others run is submitted when it arrives and planned behind the work in flight (and
``vpp-pack`` can pack it into a drain window). Followers send their reports into rank 0's inbox;
rank 0 applies its own and theirs in one order and broadcasts each as a ``Done`` op, so the
replicas stay identical. Followers never need an op that rank 0 has not sent: rank 0 broadcasts an
op before any rank can execute what it planned. Rank 0 ends the run (``End``) once no arrival is
pending and the planner is ``settled`` (everything planned and reported).

The control transport is a host-local ``multiprocessing`` queue per rank (the launcher starts
every rank on one host; rank 0's is its inbox of reports): the activations travel over the comm abstraction, the small ops do not.
``StaticFeed`` replays a precomputed ``Schedule`` instead (tests, offline plans).
"""

from __future__ import annotations

import queue as queue_module
import sys
import threading
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
from ..heartbeat import DEFAULT_HEARTBEAT_S
from ..schedule.auto_size import LiveSituation
from .spec import RunSpec

__all__ = ["Advance", "CoordinatorFeed", "Done", "End", "FollowerFeed", "Heartbeat", "PlanFeed", "Sent", "StaticFeed", "Submit",
           "make_planner", "run_controller_config"]


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
class Done:
    """Rank ``rank`` finished its next unreported action at ``t`` (seconds since the epoch)."""

    rank: int
    t: float


@dataclass(frozen=True, slots=True)
class End:
    pass


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Rank 0 is alive but has sent nothing for a while (waiting for an arrival or for a long
    compute); resets the followers' control timeout."""


Op = Submit | Sent | Advance | Done | End | Heartbeat


def run_controller_config(spec: RunSpec, layout: Layout) -> ControllerConfig:
    """The controller configuration every rank builds identically from the spec."""
    # With ``batch_requests`` whole short requests share a forward up to the chunk size, as
    # SGLang's prefill adder fills a batch (the model runs attention per request).
    return controller_config(spec.mode, layout, spec.chunk_size, spec.planner_cost,  # type: ignore[arg-type]
                             spec.max_length, batching=spec.batch_requests, auto_chunk=spec.auto_chunk,
                             partial_fill=spec.partial_fill)


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

    def done(self, t: float) -> None:
        """The action last returned by ``next_action`` finished at ``t`` (seconds since the epoch)."""

    def start(self) -> None:
        """Start whatever the feed runs in the background (called once, before the first action)."""

    def close(self) -> None:
        """Stop whatever the feed runs in the background (bounded)."""

    def check(self) -> None:
        """Raise what went wrong in the background (called while the executor waits)."""

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
        # The planner's own map (a batched forward under its lead's key), kept current by it;
        # the executor looks up only keys it was given actions for, never a joined chunk's.
        self.chunks = planner.chunks

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
        elif isinstance(op, Done):
            self.planner.action_done(op.rank, op.t)
        elif isinstance(op, End):
            self.ended = True
        self.queue.extend(self.planner.take_new_actions(self.rank))


class CoordinatorFeed(_PlannerFeed):
    """Rank 0: turns real arrivals and every rank's completion reports into planner ops, applies
    them, sends them to the followers.

    The coordination runs in a control thread (``start``) so that followers' reports are applied
    while rank 0's main thread computes (torch releases the GIL); rank 0's actions reach its main
    thread through a thread-safe queue. Without ``start`` (unit tests), ``next_action`` steps the
    coordination inline."""

    def __init__(
        self,
        planner: Planner,
        requests: Sequence[tuple[int, float]],
        followers: Sequence[Any],
        epoch: float,
        reports: Any = None,
        clock: Callable[[], float] = time.perf_counter,
        timeout_s: float = 60.0,
        report_self: Any = None,
    ) -> None:
        """``reports``: rank 0's inbox of ``Done`` ops (None: a single rank); ``report_self``:
        a writer into that inbox for rank 0's own reports, so that one blocking read wakes the
        control thread for anyone's (None: a local queue, polled)."""
        super().__init__(0, planner)
        self._timeout_s = timeout_s
        self._news_at = time.monotonic()
        self._pending = sorted(requests, key=lambda r: r[1])  # (length, arrival_s)
        self._followers = list(followers)
        self._reports = reports
        self._report_self = report_self
        self._own: queue_module.SimpleQueue[float] = queue_module.SimpleQueue()
        self._epoch = epoch
        self._clock = clock
        self._last_sent = clock()
        self._lock = threading.Lock()
        self._ready: deque[Action | None] = deque()  # None: the run is over
        self._wake = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ---------------------------------------------------------------- rank 0's main thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._control_loop, name="vpp-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive() and self._error is None:
                self._error = RuntimeError("rank 0: the control thread did not stop within 5 s (a planner call hangs)")
        if sys.exc_info()[1] is None:  # never replace an error already on its way up
            self.check()

    def check(self) -> None:
        with self._wake:
            error = self._error
        if isinstance(error, TimeoutError):
            raise error  # names its own cause and fix
        if error is not None:
            raise RuntimeError(f"rank 0: the control thread failed ({error!r}); the run cannot go on. Fix: see "
                               "the chained error (a planner or control-plane bug)") from error

    def done(self, t: float) -> None:
        if self._report_self is not None:
            self._report_self.put(Done(0, t))
        else:
            self._own.put(t)

    def upcoming(self) -> Sequence[Action]:
        with self._lock:
            return [a for a in self._ready if a is not None]

    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
        while True:
            try:
                should_abort()
            except BaseException:
                self._stop.set()
                raise
            if self._thread is None:
                self._step()
            self.check()
            with self._wake:
                if self._ready:
                    action = self._ready.popleft()
                    if action is None:
                        self._ready.appendleft(None)
                        return None
                    self.executed.append(action)
                    return action
                if self._thread is not None:
                    self._wake.wait(timeout=0.05)
            if self._thread is None and not self._ready:
                time.sleep(0.001)

    # ---------------------------------------------------------------- the coordination
    def _control_loop(self) -> None:
        try:
            while not self._stop.is_set() and not self.ended:
                self._step()
        except BaseException as error:  # surfaced in the main thread by next_action
            with self._wake:
                self._error = error
                self._wake.notify_all()

    def _step(self) -> bool:
        """Apply the news (reports, arrivals, time); True if anything happened."""
        news = self._drain_reports()
        news = self._admit_arrivals() or news
        if news or self.planner.settled:
            self._news_at = time.monotonic()
        elif self._stalled():
            raise RuntimeError(f"rank 0: every action is reported but the planner has work it cannot place: "
                               f"{self.planner.stuck_state()}. Fix: a planner bug; report it with this state")
        elif time.monotonic() - self._news_at > self._timeout_s:
            raise TimeoutError(
                f"rank 0: no completion report for {self._timeout_s:.0f}s while work is in flight; a rank "
                "is stuck or dead. Fix: read the other ranks' errors; raise Timeouts.control_s for very "
                "long computes")
        now_s = self._clock() - self._epoch
        upcoming = self.planner.next_event_time()
        if news or (upcoming is not None and upcoming <= now_s):
            self._broadcast(Advance(max(now_s, self.planner.now)))
        if not self._pending and not self.ended and self.planner.settled:
            self._broadcast(End())
            with self._wake:
                self._ready.append(None)
                self._wake.notify_all()
            return True
        if self._clock() - self._last_sent >= DEFAULT_HEARTBEAT_S:
            for follower in self._followers:
                follower.put(Heartbeat())  # keeps the followers' control timeout from firing
            self._last_sent = self._clock()
        return news

    def _stalled(self) -> bool:
        """Nothing in flight, nothing pending, and still work the planner does not place."""
        planner = self.planner
        in_flight = any(len(planner.rank_actions(r)) > planner.reported(r) for r in range(planner.config.layout.num_ranks))
        return not in_flight and not self._pending and planner.next_event_time() is None and not planner.settled

    def _wait_s(self) -> float:
        """How long the control thread may block on its inbox: until the next arrival or the
        next heartbeat, and at most 50 ms (so a stop is seen)."""
        if self._thread is None:
            return 0.0
        wait = 0.05
        if self._pending:
            wait = min(wait, self._pending[0][1] - (self._clock() - self._epoch))
        wait = min(wait, DEFAULT_HEARTBEAT_S - (self._clock() - self._last_sent))
        return max(wait, 0.0)

    def _drain_reports(self) -> bool:
        """Take every report there is (blocking briefly for the first) and apply them in time
        order (a stable sort keeps each rank's stream order): a completion callback then sees
        the time of its completion."""
        reports: list[Done] = []
        while True:
            try:
                reports.append(Done(0, self._own.get_nowait()))
            except queue_module.Empty:
                break
        if self._reports is not None:
            wait = 0.0 if reports else self._wait_s()
            while True:
                try:
                    reports.append(self._reports.get(timeout=wait))
                except queue_module.Empty:
                    break
                wait = 0.0
        elif not reports and self._thread is not None:
            time.sleep(min(self._wait_s(), 0.001))
        for op in sorted(reports, key=lambda done: done.t):
            self._broadcast(op)
        return bool(reports)

    def _broadcast(self, op: Op) -> None:
        self.apply(op)
        for follower in self._followers:
            follower.put(op)
        self._last_sent = self._clock()
        if self.queue:
            with self._wake:
                self._ready.extend(self.queue)
                self.queue.clear()
                self._wake.notify_all()

    def _admit_arrivals(self) -> bool:
        now_s = self._clock() - self._epoch
        arrived = []
        while self._pending and self._pending[0][1] <= now_s:
            arrived.append(self._pending.pop(0))
        if not arrived:
            return False
        first = len(self.lengths)
        self._broadcast(Sent(tuple((first + i, length) for i, (length, _) in enumerate(arrived))))
        for length, arrival_s in arrived:
            self._broadcast(Submit(length, self.planner.now, arrival_s))
        return True


class FollowerFeed(_PlannerFeed):
    """Ranks 1..P-1: apply rank 0's ops in order; block (bounded) when out of actions."""

    def __init__(self, rank: int, planner: Planner, queue: Any, timeout_s: float, reports: Any = None) -> None:
        super().__init__(rank, planner)
        self._queue = queue
        self._timeout_s = timeout_s
        self._reports = reports  # into rank 0, which applies and broadcasts them in its order

    def done(self, t: float) -> None:
        if self._reports is not None:
            self._reports.put(Done(self.rank, t))

    def next_action(self, should_abort: Callable[[], None]) -> Action | None:
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
