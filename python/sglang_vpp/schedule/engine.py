"""The discrete-event engine: runs per-rank action streams on a virtual clock, given or live.

One engine for every executor that needs a clock it does not have: the planner's dry run
(``dry_run.py``: the controller's own estimates), ``auto``'s what-ifs (a fork of a running
planner, ``dry_run.py``), the simulator (``sim/engine.py``: a hardware cost model, with its
accounting) and the replays of a runtime's or server's recorded streams. Pure Python: the SGLang
plugin plans with it without importing the simulator.

Two ways in, one loop:

- live (``planner``: a planner that sees transfers): the planner emits each rank's
  next actions when the controller decides them; the engine executes them and reports every
  action and transfer to the planner as it ends; after every instant that brought news (a
  report, a hand-off arriving at a rank with nothing to run, a time the planner named) the
  controller is asked again (admission, the in-flight window, the order of a rank's ready
  stages, closed-loop release), as a server's loop asks it. Nothing else changes what it can
  decide: a busy rank's arrivals wait for its own report.
- given (``schedule``): streams given in advance run exactly as given; nothing is decided.

Data flow: -> ``Engine`` (ranks, ``Link`` objects built from the streams as they grow) -> heap
loop over ``engine_events`` -> ``execute()`` (None, or the stall). The engine never decides
*what* runs: the order of every rank's work is the controller's; the engine supplies time.
What a run costs is the business of a subclass's accounting hooks (``_compute_time``,
``_admission_wait``, ``_held``, ``_transfer_timed``, ``_ran_out``): the simulator's keeps busy
time, exposed comm and idle by cause; the dry run keeps none.

Execution model (also the fidelity limits; see docs/simulator.md):

- A rank runs its actions in order, one at a time. A compute takes ``cost.stage_cost``.
- A stage-0 compute waits for the arrival of every request in its forward (``ChunkSpec.batch``
  lists the requests a batched forward carries; it completes them all when it leaves the last
  stage); in a live run it starts when the controller admits it. The engine applies no window
  and no release rule of its own: those are decisions, and the controller takes them.
- Comm: a link (group, rank pair) is one in-order stream; its i-th operations on the two ends
  pair up. Transfer i starts when both ends are posted and transfer i-1 has ended
  (``ir.transfer_span``), and takes ``cost.transfer_cost``. Different links (e.g. ``fwd`` and
  ``bwd``) run concurrently: links are full duplex and no bandwidth is shared between them.
- ``async`` schedules: a send is posted and the rank goes on; receives are pre-posted
  (``prepost_recvs``), so a transfer overlaps the receiver's compute (a live run's receive is
  emitted once its data is there, and was posted all along: the transport keeps one per link).
  ``blocking`` schedules: a send holds its rank until the transfer ends, and a receive is posted
  only when its rank reaches it. In both, a receive holds its rank until its transfer has ended.
- Posting an operation costs no time and copies use no compute.

Given streams that deadlock under rendezvous semantics should not be executed: ``check_deadlock``
(the schedule core's dry run of the streams) reports it first. If the engine still stalls (it
cannot for a schedule that passed it), the stall is reported the same way. Nothing ever hangs.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Mapping

from .cost import StageCostModel
from .deadlock import DeadlockReport, check_deadlock
from .engine_events import ComputeDoneEvent, Event, PlanEvent, RankReadyEvent, TransferDoneEvent
from .errors import ScheduleError
from .ir import Action, ActionKind, ChunkSpec, link_key, transfer_span
from .ir import recv as ir_recv
from .layout import StageSpec
from .links import Link, LinkOp
from .policies import CommSemantics
from .schedule import Schedule, schedule_from_planner

if TYPE_CHECKING:  # pragma: no cover
    from .planner import CarriedSend, Planner

__all__ = ["Engine"]


class Engine:
    """State of one run; ``execute()`` runs it (see the module docstring)."""

    def __init__(
        self,
        schedule: Schedule | None,
        cost: StageCostModel,
        *,
        planner: Planner | None = None,
        prepost_recvs: bool | None = None,
        arrivals: Mapping[int, float] | None = None,
    ) -> None:
        """Executes ``schedule``'s streams, or (``planner``: one that sees transfers)
        what the planner emits as the engine reports each action and transfer to it.
        ``prepost_recvs``: whether receives are posted ahead (None: for ``async`` semantics).
        ``arrivals`` overrides request arrival times (given streams)."""
        if (schedule is None) == (planner is None):
            raise ScheduleError("the engine runs a schedule or a live planner, not both")
        if planner is not None and not planner.sees_transfers:
            raise ScheduleError("a live run needs a planner that sees transfers (Planner(config, sees_transfers=True))")
        self.schedule = schedule
        self.planner = planner
        self.cost = cost
        layout = planner.config.layout if planner is not None else schedule.layout
        semantics = planner.config.policy.comm_semantics if planner is not None else schedule.comm_semantics
        self.num_ranks = layout.num_ranks
        self.stages: tuple[StageSpec, ...] = tuple(layout.stages)
        self.last_stage = layout.num_stages - 1
        blocking = CommSemantics(semantics) is CommSemantics.BLOCKING
        self.blocking_sends = blocking
        self.prepost = (not blocking) if prepost_recvs is None else prepost_recvs
        if planner is not None and not self.prepost and not blocking:
            raise ScheduleError("a live run keeps every async receive posted, as the planner assumes (prepost_recvs)")
        requests = planner.requests if planner is not None else schedule.requests
        self.arrival = {i: float(r.arrival) for i, r in enumerate(requests)}
        if arrivals is not None:
            self.arrival.update({int(k): float(v) for k, v in arrivals.items()})
        self.chunks: Mapping[tuple[int, int], ChunkSpec] = (
            planner.chunks if planner is not None else {c.key: c for c in schedule.chunks})
        # A live run executes the planner's own streams as they grow.
        self.actions: list[list[Action]] = (
            [planner.rank_actions(r) for r in range(self.num_ranks)] if planner is not None
            else [list(a) for a in schedule.rank_actions])
        self._registered = [0] * self.num_ranks
        """How many of each rank's actions have their comm operations registered."""
        self.pc = [0] * self.num_ranks
        self.data_ready: dict[tuple[int, int, int], float] = {}
        self.completion: dict[int, float] = {}
        self.release: dict[int, float] = {}
        self.waiting: list[tuple[LinkOp, float] | None] = [None] * self.num_ranks
        self.idle_since: list[float | None] = [None] * self.num_ranks
        """Live runs: since when a rank has had nothing to run (it reached its next action then)."""
        self._wakes: set[float] = set()
        self._news = True
        """Live runs: a report, a hand-off arriving at a rank with nothing to run, or a wake-up since
        the planner last decided."""
        self.rank_ops: list[dict[int, LinkOp]] = [{} for _ in range(self.num_ranks)]
        self.op_link: dict[int, Link] = {}
        self.links: dict[tuple[str, int, int], Link] = {}
        self.num_transfers = 0
        self.streams_deadlock = False
        """After a stall: the streams emitted deadlock by themselves (``check_deadlock``)."""
        self.start_s = min(self.arrival.values(), default=0.0)
        """Time is accounted from the first arrival: before it there is no work to idle on."""
        self._heap: list[tuple[float, int, Event]] = []
        self._counter = itertools.count()
        if planner is not None:
            for carried in planner.carried_sends:
                self._seed_transfer(carried)
        for rank in range(self.num_ranks):
            self._add_ops(rank, 0)
        if self.prepost and planner is None:
            for link in self.links.values():
                for side in link.ops.values():
                    self._propagate_prepost(side, 0, 0.0)
        # The ranks start issuing at a fork's present, else at 0.
        self._push([RankReadyEvent(planner.now if planner is not None else 0.0, rank) for rank in range(self.num_ranks)])
        for link in self.links.values():
            self._push(self._resolve(link))

    @property
    def pending(self) -> bool:
        """Events remain: a run through an ``until`` stopped before its end."""
        return bool(self._heap)

    # ------------------------------------------------------------------ accounting hooks
    def _compute_time(self, rank: int, action: Action, stage: StageSpec, chunk: ChunkSpec, start: float) -> float:
        """Seconds ``rank`` computes ``action`` from ``start`` (a subclass also accounts it)."""
        return self.cost.stage_cost(stage, chunk)

    def _admission_wait(self, rank: int, released: float, start: float) -> None:
        """``rank``'s next stage-0 compute starts at ``start``, later than the rank reached it;
        its requests were released at ``released``."""

    def _held(self, op: LinkOp, start: float, end: float) -> None:
        """``op`` held its rank from ``start`` to ``end`` (its transfer ended at ``end``)."""

    def _transfer_timed(self, link: Link, send: LinkOp, receiver: int, received: Action, start: float,
                        end: float) -> None:
        """A transfer on ``link`` was timed: ``send`` to ``receiver``'s ``received``."""

    def _ran_out(self, rank: int, now: float) -> None:
        """``rank`` reached the end of its stream at ``now``."""

    # ------------------------------------------------------------------ setup
    def _link(self, group: str, rank: int, peer: int) -> Link:
        key = link_key(group, rank, peer)
        link = self.links.get(key)
        if link is None:
            _, low, high = key
            link = Link(group, low, high, {low: [], high: []})
            self.links[link.key] = link
        return link

    def _seed_transfer(self, carried: CarriedSend) -> None:
        """A fork's hand-off whose send was emitted before the fork and whose receive was not
        (``Planner.carried_sends``): the receive the fork emits pairs with it. It arrived at
        ``carried.time``, or was posted then and is timed on its link like any other."""
        send = carried.send
        rank = self.stages[send.stage_index].rank
        link = self.links.get(link_key(send.group, rank, send.peer))
        if link is None:
            link = self._link(send.group, rank, send.peer)
            link.free_at = self.planner.link_free_at(link.key)
        # Not in the fork's streams: no step (-1).
        op = LinkOp(rank, -1, send, len(link.ops[rank]), post_time=carried.time)
        link.ops[rank].append(op)
        if carried.arrived:
            link.starts.append(carried.time)
            link.ends.append(carried.time)

    def _add_ops(self, rank: int, start: int) -> list[Link]:
        """Register the comm actions of ``rank``'s stream from ``start`` with their links
        (returned)."""
        actions = self.actions[rank]
        touched = []
        self._registered[rank] = len(actions)
        for step in range(start, len(actions)):
            action = actions[step]
            if action.kind is ActionKind.COMPUTE:
                continue
            if action.peer is None or not 0 <= action.peer < self.num_ranks or action.peer == rank:
                raise ScheduleError(f"rank {rank} step {step}: {action} names peer {action.peer}; "
                                    f"expected another rank in 0..{self.num_ranks - 1}: validate the schedule")
            link = self._link(action.group, rank, action.peer)
            side = link.ops[rank]
            op = LinkOp(rank, step, action, len(side))
            side.append(op)
            self.rank_ops[rank][step] = op
            self.op_link[id(op)] = link
            touched.append(link)
            if self.planner is not None:
                self._pair_live(link, op)
        return touched

    def _pair_live(self, link: Link, op: LinkOp) -> None:
        """A live run's receive may be registered after its transfer was timed (it is emitted
        when its data is there): if it pairs with the send that transfer carried, it was posted
        from the transfer's start."""
        if op.index >= len(link.ends) or link.pair(op.index) is None:
            return  # out-of-order hand-offs (both directions on one group) stall: reported at the end
        if self.prepost and op.action.kind is ActionKind.RECV:
            op.post_time = link.starts[op.index]

    def _propagate_prepost(self, side: list[LinkOp], start: int, time: float) -> None:
        """Receives following a posted operation on the same side are posted with it."""
        for op in side[start:]:
            if op.action.kind is not ActionKind.RECV or op.post_time is not None:
                break
            op.post_time = time

    # ------------------------------------------------------------------ the loop
    def _push(self, events: list[Event]) -> None:
        for event in events:
            heapq.heappush(self._heap, (event.time, next(self._counter), event))

    def execute(self, until: float | None = None) -> DeadlockReport | None:
        """Run to the end (None, or what stalled: ``streams_deadlock`` says whether the streams
        emitted deadlock by themselves), or (``until``) through every event up to that time and
        stop there. A later call goes on from the planner's present (its last report or decision,
        at or before ``until``: an arrival at a busy rank after it does not move it), with whatever
        was submitted to it meanwhile."""
        if self.planner is not None:
            self._record_arrivals()
            self._push([PlanEvent(self.planner.now)])
        return self.go_on(until)

    def go_on(self, until: float | None = None) -> DeadlockReport | None:
        """``execute`` from where a run through an earlier ``until`` stopped, exactly as if it had
        not stopped there: nothing may have been submitted to the planner since (``execute``
        takes that in first)."""
        heap = self._heap
        while heap and (until is None or heap[0][0] <= until):
            now, _, event = heapq.heappop(heap)
            self._push(event.handle(self))
            if self.planner is not None and self._news and (not heap or heap[0][0] > now):
                # Every event of this instant is in: the controller decides now, as a server would
                # (only when something it decides on has happened since it last did).
                self._news = False
                self._push(self._plan(now))
        if heap:
            return None
        if self.planner is not None:
            self.schedule = schedule_from_planner(self.planner)
        stalled = any(self.pc[r] < len(self.actions[r]) for r in range(self.num_ranks))
        if self.planner is not None and not self.planner.settled:
            stalled = True
        return self._stall_report() if stalled else None

    def _plan(self, now: float) -> list[Event]:
        """Live runs: the planner decides at ``now``; ranks that were out of work resume; the
        planner's next due time wakes the loop."""
        planner = self.planner
        assert planner is not None
        if self.idle_since.count(None) == self.num_ranks:
            # Every rank has work the planner gave it and it has not all reported: the planner
            # gives work only to a rank that has, so there is nothing to decide yet.
            return []
        planner.advance(until=now)
        self._record_arrivals()
        events: list[Event] = []
        touched: dict[Link, None] = {}  # in first-touched order
        for rank in range(self.num_ranks):
            start = self._registered[rank]
            if len(self.actions[rank]) == start:
                continue
            touched.update(dict.fromkeys(self._add_ops(rank, start)))
            if self.idle_since[rank] is not None:
                events.append(RankReadyEvent(now, rank))
        for link in touched:
            events += self._resolve(link)
        upcoming = planner.next_event_time()
        if upcoming is not None and upcoming not in self._wakes:
            self._wakes.add(upcoming)
            events.append(PlanEvent(upcoming))
        return events

    def issue(self, rank: int, now: float) -> list[Event]:
        """Issue ``rank``'s actions from its program counter until one takes time or blocks."""
        actions = self.actions[rank]
        events: list[Event] = []
        if self.waiting[rank] is not None:
            return events  # held by a transfer; its end wakes the rank
        # A live rank that ran out of work reached its next action when it ran out: it has waited
        # on that action since, as it would have on the same stream given in advance.
        reached = self.idle_since[rank] if self.idle_since[rank] is not None else now
        self.idle_since[rank] = None
        while self.pc[rank] < len(actions):
            step = self.pc[rank]
            action = actions[step]
            if action.kind is ActionKind.COMPUTE:
                if action.stage_index == 0:
                    released, start = self._start_time(action, now)
                    if start > reached:
                        self._admission_wait(rank, released, start)
                    if start > now:
                        return events + [RankReadyEvent(start, rank)]
                end = self._compute(rank, step, now)
                self.pc[rank] += 1
                if self.planner is not None:
                    return events + [ComputeDoneEvent(end, rank)]
                return events + [RankReadyEvent(end, rank)]
            op = self.rank_ops[rank][step]
            link = self.op_link[id(op)]
            if op.post_time is None:
                op.post_time = now
                if self.prepost:
                    self._propagate_prepost(link.ops[rank], op.index + 1, now)
                events += self._resolve(link)
            holds = action.kind is ActionKind.RECV or self.blocking_sends
            end = link.end_of(op.index)
            if holds and (end is None or end > now):
                self.waiting[rank] = (op, reached)
                return events
            if holds and reached < now:
                self._held(op, reached, end)
            self.pc[rank] += 1
            reached = now
            self._done(rank, now)
        self._ran_out(rank, now)
        if self.planner is not None:
            self.idle_since[rank] = now
        return events

    def compute_done(self, rank: int, now: float) -> list[Event]:
        """Live runs: ``rank``'s compute ended; the planner learns it, the rank goes on."""
        self._done(rank, now)
        return self.issue(rank, now)

    def finish_transfer(self, link: Link, index: int, now: float) -> list[Event]:
        """Transfer ``index`` on ``link`` ended at ``now``: release the ranks it held."""
        events: list[Event] = []
        if self.planner is not None:
            send = next(side[index] for side in link.ops.values()
                        if index < len(side) and side[index].action.kind is ActionKind.SEND)
            self.planner.transfer_done(send.action.stage_index, send.action.chunk_key, now)
            # An arrival changes only what its receiver can run: news for the planner if the
            # receiver has nothing to run (a busy receiver's report will ask it anyway).
            if self.idle_since[link.high + link.low - send.rank] is not None:
                self._news = True
        for side in (link.ops[link.low], link.ops[link.high]):
            if index >= len(side):
                continue  # a live receive not emitted yet (its data is there now)
            op = side[index]
            waiting = self.waiting[op.rank]
            if waiting is None or waiting[0] is not op:
                continue
            self.waiting[op.rank] = None
            self._held(op, waiting[1], now)
            self.pc[op.rank] += 1
            self._done(op.rank, now)
            events.append(RankReadyEvent(now, op.rank))
        return events

    def _done(self, rank: int, now: float) -> None:
        """Live runs: report ``rank``'s last finished action to the planner."""
        if self.planner is not None:
            self.planner.action_done(rank, now)
            self._record_arrivals()
            self._news = True

    def wake(self) -> list[Event]:
        """Live runs: the planner has a decision due now (``PlanEvent``)."""
        self._news = True
        return []

    def _record_arrivals(self) -> None:
        """The arrivals of requests submitted since: a completion (reported, or a fork's due
        now) may have sent a closed loop's next request, or a caller between two runs."""
        requests = self.planner.requests
        for request in range(len(self.arrival), len(requests)):
            self.arrival.setdefault(request, float(requests[request].arrival))

    # ------------------------------------------------------------------ helpers
    def _resolve(self, link: Link) -> list[Event]:
        """Time every transfer whose two ends are posted, in link order. A live run's async
        receive is posted before it is emitted (one per link, always): its transfer is timed
        from the send."""
        events: list[Event] = []
        live_receive = self.planner is not None and self.prepost
        while True:
            index = len(link.ends)
            low, high = link.ops[link.low], link.ops[link.high]
            if index < len(low) and index < len(high):
                pair = link.pair(index)
                if pair is None:
                    break  # mismatched heads: a deadlock, reported by the stall check
                send, recv = pair
                posted = recv.post_time if not live_receive else send.post_time
                if send.post_time is None or posted is None:
                    break
            elif live_receive and max(len(low), len(high)) > index:
                send = (low if len(low) > index else high)[index]
                recv = None
                if send.action.kind is not ActionKind.SEND or send.post_time is None:
                    break
                posted = send.post_time
            else:
                break
            previous = link.ends[-1] if link.ends else link.free_at
            stage_index, request_index, chunk_index = send.action.key
            chunk = self.chunks[(request_index, chunk_index)]
            start, end = transfer_span(max(send.post_time, posted), previous,
                                       self.cost.transfer_cost(self.stages[stage_index], chunk))
            link.starts.append(start)
            link.ends.append(end)
            self.num_transfers += 1
            # A live receive not emitted yet is the one the planner will emit for this send.
            receiver = recv.rank if recv is not None else link.high + link.low - send.rank
            received = recv.action if recv is not None else ir_recv(
                stage_index, request_index, chunk_index, send.rank, link.group)
            self._transfer_timed(link, send, receiver, received, start, end)
            events.append(TransferDoneEvent(end, link, index))
        return events

    def _compute(self, rank: int, step: int, now: float) -> float:
        action = self.actions[rank][step]
        chunk = self.chunks[action.chunk_key]
        stage = self.stages[action.stage_index]
        assert stage.rank == rank, (rank, step, action)
        end = now + self._compute_time(rank, action, stage, chunk, now)
        self.data_ready[action.key] = end
        if action.stage_index == self.last_stage:
            for request_index in chunk.completed_requests:
                self.completion[request_index] = end
        return end

    def _start_time(self, action: Action, now: float) -> tuple[float, float]:
        """(release, start) of a stage-0 compute: the latest arrival of the requests in its
        forward, and when it can start: at its release for given streams; a live run's
        controller admitted it now."""
        released = 0.0
        for part in self.chunks[action.chunk_key].parts:
            request = part.request_index
            if request not in self.release:
                # Given streams may name no requests (hand-written, a JSON schedule without
                # them): such a request is there from the start.
                self.release[request] = self.arrival.get(request, 0.0)
            released = max(released, self.release[request])
        return released, max(released, now if self.planner is not None else 0.0)

    def _stall_report(self) -> DeadlockReport:
        report = check_deadlock(self.schedule)
        self.streams_deadlock = report.deadlock
        if report.deadlock:
            return report
        blocked = []
        for rank in range(self.num_ranks):
            actions = self.actions[rank]
            if self.pc[rank] < len(actions):
                action = actions[self.pc[rank]]
                blocked.append({"rank": rank, "step": self.pc[rank], "action": str(action),
                                "waits_for": action.peer, "reason": "stalled in the engine (link heads never pair)"})
        return DeadlockReport(True, [], blocked, self.schedule.num_actions)
