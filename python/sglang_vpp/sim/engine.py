"""The discrete-event engine: runs per-rank action streams on a virtual clock, given or live.

Two ways in, one loop:

- ``simulate_live(planner, durations)``: the simulator. The planner (external: no clock of its
  own) emits each rank's next actions when the controller decides them; the engine executes
  them and reports every action and transfer to the planner as it ends; after every instant
  that had events the controller is asked again (admission, the in-flight window, the order of
  a rank's ready stages, closed-loop release), as a server's loop asks it. The streams it
  emitted are validated and deadlock-checked afterwards.
- ``simulate_schedule(schedule, cost)``: streams given in advance (a runtime's or a server's
  recorded execution re-timed): the streams run exactly as given; nothing is decided.

Data flow: -> ``Engine`` (ranks, ``Communicator`` objects built from the streams as they grow) ->
heap loop over ``events`` -> ``SimResult`` (makespan, per-rank compute / exposed comm / bubble,
TTFT, timeline). The engine never decides *what* runs: the order of every rank's work is the
schedule core's; the engine supplies time and the accounting.

Execution model (also the fidelity limits; see docs/simulator.md):

- A rank runs its actions in order, one at a time. A compute takes the cost model's stage time
  (math + exposed TP collectives + host overhead, see ``cost.base.StageTime``).
- A stage-0 compute waits for the arrival of every request in its forward (``ChunkSpec.batch``
  lists the requests a batched forward carries; it completes them all when it leaves the last
  stage); in a live run it starts when the controller admits it. The engine applies no window
  and no release rule of its own: those are decisions, and the controller takes them.
- Comm: a communicator (group, rank pair) is one in-order stream; its i-th operations on the two
  ends pair up. Transfer i starts when both ends are posted and transfer i-1 has ended
  (``ir.transfer_span``), and takes ``cost.transfer_cost``. Different communicators (e.g.
  ``fwd`` and ``bwd``) run concurrently: links are full duplex and no bandwidth is shared
  between them.
- ``async`` schedules: a send is posted and the rank goes on; receives are pre-posted (see
  ``SimConfig.prepost_recvs``), so a transfer overlaps the receiver's compute (a live run's
  receive is emitted once its data is there, and was posted all along, as the planner assumes).
  ``blocking`` schedules: a send holds its rank until the transfer ends, and a receive is posted
  only when its rank reaches it. In both, a receive holds its rank until its transfer has ended.
- Posting an operation costs no time and copies use no compute: no contention between a transfer
  and the math on the same device is modelled.
- Time a rank is held by a comm action is exposed communication from the moment the data it
  carries was produced (a blocking send: from the moment its copy starts, i.e. the receiver has
  posted); before that it is bubble. A live rank that ran out of work waits on the action the
  controller gives it next from the moment it ran out, as it would on the same stream given in
  advance. Every bubble interval is charged to its cause (``idle.IdleLedger``: fill, upstream
  wait, rendezvous, admission, release, host scheduling gap, drain).

Given streams that deadlock under rendezvous semantics are not executed: ``check_deadlock``
(the schedule core's dry run) reports it first. If the engine still stalls (it cannot for a
schedule that passed the dry run), the stall is reported the same way. Nothing ever hangs.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Mapping

from ..schedule import (ActionKind, ChunkSpec, CommSemantics, DeadlockReport, Planner, Schedule, StageCostModel,
                        check_deadlock, schedule_from_planner)
from ..schedule.ir import Action, link_key, transfer_span
from ..schedule.ir import recv as ir_recv
from .communicator import CommOp, Communicator
from .config import SimConfig
from .cost.base import StageTime, stage_time
from .entities import RankStats, SliceKind, TimelineSlice
from .errors import SimDeadlockError, SimError
from .events import ComputeDoneEvent, Event, PlanEvent, RankReadyEvent, TransferDoneEvent
from .idle import IdleCause, IdleLedger
from .result import SimResult

__all__ = ["Engine", "simulate_live", "simulate_schedule"]


class Engine:
    """State of one simulation; ``run()`` executes it. Use ``simulate_schedule`` or ``simulate_live``."""

    def __init__(
        self,
        schedule: Schedule | None,
        cost: StageCostModel,
        config: SimConfig = SimConfig(),
        arrivals: Mapping[int, float] | None = None,
        planner: Planner | None = None,
    ) -> None:
        """Executes ``schedule``'s streams, or (``planner``: an external one, seeing transfers)
        what the planner emits as the engine reports each action and transfer to it."""
        if (schedule is None) == (planner is None):
            raise SimError("the engine runs a schedule or a live planner, not both")
        if planner is not None and not planner.external:
            raise SimError("a live run needs an external planner (Planner(external=True, sees_transfers=True))")
        self.schedule = schedule
        self.planner = planner
        self.cost = cost
        self.config = config
        layout = planner.config.layout if planner is not None else schedule.layout
        semantics = planner.config.policy.comm_semantics if planner is not None else schedule.comm_semantics
        self.num_ranks = layout.num_ranks
        self.stages = layout.stages
        self.last_stage = layout.num_stages - 1
        blocking = CommSemantics(semantics) is CommSemantics.BLOCKING
        self.blocking_sends = blocking
        self.prepost = (not blocking) if config.prepost_recvs is None else config.prepost_recvs
        if planner is not None and not self.prepost and not blocking:
            raise SimError("a live run keeps every async receive posted, as the planner assumes (prepost_recvs)")
        requests = planner.requests if planner is not None else schedule.requests
        self.arrival = {i: float(r.arrival) for i, r in enumerate(requests)}
        if arrivals is not None:
            self.arrival.update({int(k): float(v) for k, v in arrivals.items()})
        self.chunks: Mapping[tuple[int, int], ChunkSpec] = (
            planner.chunks if planner is not None else {c.key: c for c in schedule.chunks})
        self.actions: list[list[Action]] = (
            [[] for _ in range(self.num_ranks)] if planner is not None else [list(a) for a in schedule.rank_actions])
        self.pc = [0] * self.num_ranks
        self.stats = [RankStats(rank) for rank in range(self.num_ranks)]
        self.timeline: list[TimelineSlice] = []
        self.data_ready: dict[tuple[int, int, int], float] = {}
        self.completion: dict[int, float] = {}
        self.release: dict[int, float] = {}
        self.waiting: list[tuple[CommOp, float] | None] = [None] * self.num_ranks
        self.idle_since: list[float | None] = [None] * self.num_ranks
        """Live runs: since when a rank has had nothing to run (it reached its next action then)."""
        self._wakes: set[float] = set()
        self._news = True
        """Live runs: a report, a transfer or a wake-up since the planner last decided."""
        self.rank_ops: list[dict[int, CommOp]] = [{} for _ in range(self.num_ranks)]
        self.op_comm: dict[int, Communicator] = {}
        self.communicators: dict[tuple[str, int, int], Communicator] = {}
        self.stage_totals = [0.0] * len(self.stages)
        self.num_transfers = 0
        # Time is accounted from the first arrival: before it there is no work to idle on.
        self.start_s = min(self.arrival.values(), default=0.0)
        self.idle = IdleLedger(self.num_ranks, self.start_s)
        for rank in range(self.num_ranks):
            self._add_ops(rank, 0)
        if self.prepost and planner is None:
            for comm in self.communicators.values():
                for side in comm.ops.values():
                    self._propagate_prepost(side, 0, 0.0)

    # ------------------------------------------------------------------ setup
    def _add_ops(self, rank: int, start: int) -> list[Communicator]:
        """Register the comm actions of ``rank``'s stream from ``start`` with their communicators
        (returned)."""
        actions = self.actions[rank]
        touched = []
        for step in range(start, len(actions)):
            action = actions[step]
            if action.kind is ActionKind.COMPUTE:
                continue
            if action.peer is None or not 0 <= action.peer < self.num_ranks or action.peer == rank:
                raise SimError(f"rank {rank} step {step}: {action} names peer {action.peer}; "
                               f"expected another rank in 0..{self.num_ranks - 1}: validate the schedule")
            key = link_key(action.group, rank, action.peer)
            comm = self.communicators.get(key)
            if comm is None:
                _, low, high = key
                comm = Communicator(action.group, low, high, {low: [], high: []})
                self.communicators[comm.key] = comm
            side = comm.ops[rank]
            op = CommOp(rank, step, action, len(side))
            side.append(op)
            self.rank_ops[rank][step] = op
            self.op_comm[id(op)] = comm
            touched.append(comm)
            if self.planner is not None:
                self._pair_live(comm, op)
        return touched

    def _pair_live(self, comm: Communicator, op: CommOp) -> None:
        """A live run's receive may be registered after its transfer was timed (it is emitted
        when its data is there): check that it pairs with the send that transfer carried, and
        mark it posted from the transfer's start."""
        if op.index >= len(comm.ends):
            return
        if comm.pair(op.index) is None:
            raise SimError(f"{comm.describe()}: operation {op.index} is {op.action} on rank {op.rank}, which does "
                           "not pair with the other end's: the planner emitted out-of-order hand-offs")
        if self.prepost and op.action.kind is ActionKind.RECV:
            op.post_time = comm.starts[op.index]

    def _propagate_prepost(self, side: list[CommOp], start: int, time: float) -> None:
        """Receives following a posted operation on the same side are posted with it."""
        for op in side[start:]:
            if op.action.kind is not ActionKind.RECV or op.post_time is not None:
                break
            op.post_time = time

    # ------------------------------------------------------------------ the loop
    def run(self) -> SimResult:
        heap: list[tuple[float, int, Event]] = []
        counter = itertools.count()

        def push(events: list[Event]) -> None:
            for event in events:
                heapq.heappush(heap, (event.time, next(counter), event))

        if self.planner is not None:
            push([PlanEvent(self.planner.now)])
        push([RankReadyEvent(0.0, rank) for rank in range(self.num_ranks)])
        for comm in self.communicators.values():
            push(self._resolve(comm))
        while heap:
            now, _, event = heapq.heappop(heap)
            push(event.handle(self))
            if self.planner is not None and self._news and (not heap or heap[0][0] > now):
                # Every event of this instant is in: the controller decides now, as a server would
                # (only when something it decides on has happened since it last did).
                self._news = False
                push(self._plan(now))
        if self.planner is not None:
            self.schedule = schedule_from_planner(self.planner)
        stalled = any(self.pc[r] < len(self.actions[r]) for r in range(self.num_ranks))
        if self.planner is not None and not self.planner.settled:
            stalled = True
        return self._result(self._stall_report() if stalled else None)

    def _plan(self, now: float) -> list[Event]:
        """Live runs: the planner decides at ``now``; ranks that were out of work resume; the
        next arrival wakes the loop."""
        planner = self.planner
        assert planner is not None
        planner.advance(until=now)
        events: list[Event] = []
        touched: dict[tuple[str, int, int], Communicator] = {}
        for rank in range(self.num_ranks):
            new = planner.take_new_actions(rank)
            if not new:
                continue
            start = len(self.actions[rank])
            self.actions[rank].extend(new)
            touched.update((c.key, c) for c in self._add_ops(rank, start))
            if self.idle_since[rank] is not None:
                events.append(RankReadyEvent(now, rank))
        for comm in touched.values():
            events += self._resolve(comm)
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
                        cause = IdleCause.RELEASE if released >= start else IdleCause.ADMISSION
                        self.idle.stopped(rank, cause)
                    if start > now:
                        return events + [RankReadyEvent(start, rank)]
                end = self._compute(rank, step, now)
                self.pc[rank] += 1
                if self.planner is not None:
                    return events + [ComputeDoneEvent(end, rank)]
                return events + [RankReadyEvent(end, rank)]
            op = self.rank_ops[rank][step]
            comm = self.op_comm[id(op)]
            if op.post_time is None:
                op.post_time = now
                if self.prepost:
                    self._propagate_prepost(comm.ops[rank], op.index + 1, now)
                events += self._resolve(comm)
            holds = action.kind is ActionKind.RECV or self.blocking_sends
            end = comm.end_of(op.index)
            if holds and (end is None or end > now):
                self.waiting[rank] = (op, reached)
                return events
            if holds and reached < now:
                self._account_wait(op, reached, end)
            self.pc[rank] += 1
            reached = now
            events += self._done(rank, now)
        self.stats[rank].busy_until = max(self.stats[rank].busy_until, now)
        if self.planner is not None:
            self.idle_since[rank] = now
        return events

    def compute_done(self, rank: int, now: float) -> list[Event]:
        """Live runs: ``rank``'s compute ended; the planner learns it, the rank goes on."""
        return self._done(rank, now) + self.issue(rank, now)

    def finish_transfer(self, comm: Communicator, index: int, now: float) -> list[Event]:
        """Transfer ``index`` on ``comm`` ended at ``now``: release the ranks it held."""
        events: list[Event] = []
        if self.planner is not None:
            send = next(side[index] for side in comm.ops.values()
                        if index < len(side) and side[index].action.kind is ActionKind.SEND)
            self.planner.transfer_done(send.action.stage_index, send.action.chunk_key, now)
            self._news = True
        for side in (comm.ops[comm.low], comm.ops[comm.high]):
            if index >= len(side):
                continue  # a live receive not emitted yet (its data is there now)
            op = side[index]
            waiting = self.waiting[op.rank]
            if waiting is None or waiting[0] is not op:
                continue
            self.waiting[op.rank] = None
            self._account_wait(op, waiting[1], now)
            self.pc[op.rank] += 1
            events += self._done(op.rank, now)
            events.append(RankReadyEvent(now, op.rank))
        return events

    def _done(self, rank: int, now: float) -> list[Event]:
        """Live runs: report ``rank``'s last finished action to the planner."""
        if self.planner is not None:
            self.planner.action_done(rank, now)
            self._record_arrivals()
            self._news = True
        return []

    def wake(self) -> list[Event]:
        """Live runs: the planner has a decision due now (``PlanEvent``)."""
        self._news = True
        return []

    def _record_arrivals(self) -> None:
        # A completion may have sent the closed loop's next request.
        requests = self.planner.requests
        for request in range(len(self.arrival), len(requests)):
            self.arrival.setdefault(request, float(requests[request].arrival))

    # ------------------------------------------------------------------ helpers
    def _resolve(self, comm: Communicator) -> list[Event]:
        """Time every transfer whose two ends are posted, in communicator order. A live run's
        async receive is posted before it is emitted (one per link, always): its transfer is
        timed from the send."""
        events: list[Event] = []
        live_receive = self.planner is not None and self.prepost
        while True:
            index = len(comm.ends)
            low, high = comm.ops[comm.low], comm.ops[comm.high]
            if index < len(low) and index < len(high):
                pair = comm.pair(index)
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
            previous = comm.ends[-1] if comm.ends else 0.0
            stage_index, request_index, chunk_index = send.action.key
            chunk = self.chunks[(request_index, chunk_index)]
            start, end = transfer_span(max(send.post_time, posted), previous,
                                       self.cost.transfer_cost(self.stages[stage_index], chunk))
            comm.starts.append(start)
            comm.ends.append(end)
            self.num_transfers += 1
            if self.config.record_timeline:
                # A live receive not emitted yet is the one the planner will emit for this send.
                receiver = recv.rank if recv is not None else comm.high + comm.low - send.rank
                received = recv.action if recv is not None else ir_recv(
                    stage_index, request_index, chunk_index, send.rank, comm.group)
                for rank, action, kind in ((send.rank, send.action, SliceKind.SEND),
                                           (receiver, received, SliceKind.RECV)):
                    self.timeline.append(TimelineSlice(rank, str(action), kind, start, end, comm.group,
                                                       stage_index, request_index, chunk_index))
            events.append(TransferDoneEvent(end, comm, index))
        return events

    def _compute(self, rank: int, step: int, now: float) -> float:
        action = self.actions[rank][step]
        chunk = self.chunks[action.chunk_key]
        stage = self.stages[action.stage_index]
        assert stage.rank == rank, (rank, step, action)
        parts: StageTime = stage_time(self.cost, stage, chunk)
        end = now + parts.total_s
        stats = self.stats[rank]
        stats.compute_s += parts.compute_s
        stats.exposed_tp_comm_s += parts.tp_comm_s
        stats.overhead_s += parts.overhead_s
        stats.num_computes += 1
        stats.busy_until = end
        self.idle.compute(rank, now, end, parts.overhead_s)
        self.stage_totals[action.stage_index] += parts.total_s
        self.data_ready[action.key] = end
        if self.config.record_timeline:
            self.timeline.append(TimelineSlice(
                rank, str(action), SliceKind.COMPUTE, now, end, None, action.stage_index,
                action.request_index, action.chunk_index,
                {"compute_s": parts.compute_s, "tp_comm_s": parts.tp_comm_s, "overhead_s": parts.overhead_s,
                 "tokens": chunk.total_tokens, "prefix": chunk.start,
                 "requests": [part.request_index for part in chunk.parts]}))
        if action.stage_index == self.last_stage and chunk.is_last:
            for part in chunk.parts:
                self.completion[part.request_index] = end
        return end

    def _start_time(self, action, now: float) -> tuple[float, float]:
        """(release, start) of a stage-0 compute: the latest arrival of the requests in its
        forward, and when it can start: at its release for given streams; a live run's
        controller admitted it now."""
        released = 0.0
        for part in self.chunks[action.chunk_key].parts:
            request = part.request_index
            if request not in self.release:
                self.release[request] = self.arrival.get(request, 0.0)
            released = max(released, self.release[request])
        return released, max(released, now if self.planner is not None else 0.0)

    def _account_wait(self, op: CommOp, start: float, end: float) -> None:
        stats = self.stats[op.rank]
        if op.action.kind is ActionKind.SEND:
            # A blocking send: its data is there, but the copy starts only once the receiver has
            # posted (a rendezvous); the wait before that is idle, the copy exposed comm.
            produced = self.op_comm[id(op)].starts[op.index]
            cause = IdleCause.RENDEZVOUS
        else:
            produced = self.data_ready.get(op.action.key, start)
            cause = IdleCause.UPSTREAM_WAIT
        data_wait = max(0.0, min(produced, end) - start)
        exposed = end - max(start, produced)
        self.idle.wait(op.rank, start, end, data_wait, cause)
        stats.exposed_pp_comm_s += max(0.0, exposed)
        stats.busy_until = max(stats.busy_until, end)
        if self.config.record_timeline:
            a = op.action
            if data_wait > 0:
                self.timeline.append(TimelineSlice(op.rank, str(a), SliceKind.WAIT_DATA, start, start + data_wait,
                                                   a.group, a.stage_index, a.request_index, a.chunk_index))
            if exposed > 0:
                self.timeline.append(TimelineSlice(op.rank, str(a), SliceKind.WAIT_COMM, end - exposed, end,
                                                   a.group, a.stage_index, a.request_index, a.chunk_index))

    def _stall_report(self) -> DeadlockReport:
        report = check_deadlock(self.schedule)
        if report.deadlock:
            return report
        blocked = []
        for rank in range(self.num_ranks):
            actions = self.actions[rank]
            if self.pc[rank] < len(actions):
                action = actions[self.pc[rank]]
                blocked.append({"rank": rank, "step": self.pc[rank], "action": str(action),
                                "waits_for": action.peer, "reason": "stalled in simulation (comm heads "
                                "never pair)"})
        return DeadlockReport(True, [], blocked, self.schedule.num_actions)

    def _result(self, deadlock: DeadlockReport | None) -> SimResult:
        transfer_end = max((c.ends[-1] for c in self.communicators.values() if c.ends), default=0.0)
        makespan = max([s.busy_until for s in self.stats] + [transfer_end, 0.0])
        for stats in self.stats:
            idle = makespan - self.start_s - stats.compute_s - stats.exposed_comm_s
            stats.bubble_s = max(0.0, idle)
            stats.idle_by_cause = self.idle.finish(stats.rank, makespan, stats.bubble_s)
        ttft = {r: self.completion[r] - self.release.get(r, self.arrival.get(r, 0.0)) for r in self.completion}
        return SimResult(
            policy=str(self.schedule.policy),
            num_ranks=self.num_ranks,
            makespan_s=makespan,
            start_s=self.start_s,
            per_rank=self.stats,
            request_ttft_s=ttft,
            request_finish_s=dict(self.completion),
            request_release_s=dict(self.release),
            steps=self.stats[0].num_computes,
            num_chunks=len(self.schedule.chunks),
            num_transfers=self.num_transfers,
            num_tokens=sum(c.total_tokens for c in self.schedule.chunks),
            stage_totals_s=tuple(self.stage_totals),
            timeline=sorted(self.timeline, key=lambda s: (s.start, s.rank)),
            deadlock=deadlock,
        )


def simulate_schedule(
    schedule: Schedule,
    cost: StageCostModel,
    config: SimConfig | None = None,
    *,
    arrivals: Mapping[int, float] | None = None,
) -> SimResult:
    """Execute ``schedule`` with durations from ``cost``; see the module docstring for the model.

    ``arrivals`` overrides request arrival times (seconds). The streams run as given: what
    re-times an execution that already happened (a runtime's, a server's) wants; a simulation
    that decides as it goes is ``simulate_live``.
    """
    config = config or SimConfig()
    if config.check_deadlock:
        report = check_deadlock(schedule)
        if report.deadlock:
            if config.raise_on_deadlock:
                raise SimDeadlockError(report.describe(schedule.rank_actions), report)
            return SimResult.deadlocked(schedule, report)
    engine = Engine(schedule, cost, config, arrivals)
    result = engine.run()
    if result.deadlock is not None and config.raise_on_deadlock:
        raise SimDeadlockError(result.deadlock.describe(schedule.rank_actions), result.deadlock)
    return result


def simulate_live(planner: Planner, durations: StageCostModel, config: SimConfig | None = None) -> SimResult:
    """Run the work submitted to ``planner`` (external, seeing transfers; more may follow from
    its completion callback) on the engine: the controller decides at each instant of the
    simulation, as it would in a server, with the durations ``durations`` gives. The streams it
    emitted are checked afterwards (``check_deadlock``); ``SimResult.deadlock`` reports a stall."""
    config = config or SimConfig()
    engine = Engine(None, durations, config, planner=planner)
    result = engine.run()
    if result.deadlock is None and config.check_deadlock:
        report = check_deadlock(engine.schedule)
        if report.deadlock:
            result = SimResult.deadlocked(engine.schedule, report)
    if result.deadlock is not None and config.raise_on_deadlock:
        raise SimDeadlockError(result.deadlock.describe(engine.schedule.rank_actions), result.deadlock)
    return result
