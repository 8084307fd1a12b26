"""The discrete-event engine: executes a ``Schedule``'s per-rank action streams on a virtual clock.

Data flow: ``simulate_schedule(schedule, cost)`` -> ``Engine`` (ranks, ``Communicator``\\ s built
from the streams) -> heap loop over ``events`` -> ``SimResult`` (makespan, per-rank compute /
exposed comm / bubble, TTFT, timeline). The engine never decides *what* runs: the order of every
rank's work is the schedule core's; the engine only supplies time.

Execution model (also the fidelity limits; see docs/simulator.md):

- A rank runs its actions in order, one at a time. A compute takes the cost model's stage time
  (math + exposed TP collectives + host overhead, see ``cost.base.StageTime``).
- A stage-0 compute waits for the arrival of every request in its forward (``ChunkSpec.batch``
  lists the requests a batched forward carries; it completes them all when it leaves the last
  stage) and, when the caller passes them, for the time the controller admitted it
  (``admitted_at``, ``Schedule.admission_times``: the dry run on the same durations, where the
  controller was asked at event time for admission, the in-flight window and closed-loop
  release). The engine applies no window and no release rule of its own: those are decisions,
  and the dry run is where they are taken. Without ``admitted_at`` the streams run exactly as
  given (what a replay of a runtime execution wants).
- Comm: a communicator (group, rank pair) is one in-order stream; its i-th operations on the two
  ends pair up. Transfer i starts when both ends are posted and transfer i-1 has ended, and takes
  ``cost.transfer_cost``. Different communicators (e.g. ``fwd`` and ``bwd``) run concurrently:
  links are full duplex and no bandwidth is shared between them.
- ``async`` schedules: a send is posted and the rank goes on; receives are pre-posted (see
  ``SimConfig.prepost_recvs``), so a transfer overlaps the receiver's compute. ``blocking``
  schedules: a send holds its rank until the transfer ends, and a receive is posted only when its
  rank reaches it. In both, a receive holds its rank until its transfer has ended.
- Posting an operation costs no time and copies use no compute: no contention between a transfer
  and the math on the same device is modelled.
- Time a rank is held by a comm action is exposed communication from the moment the data it
  carries was produced (a blocking send: from the moment its copy starts, i.e. the receiver has
  posted); before that it is bubble. Every bubble interval is charged to its cause
  (``idle.IdleLedger``: fill, upstream wait, rendezvous, admission, release, host scheduling
  gap, drain).

A schedule that deadlocks under rendezvous semantics is not executed: ``check_deadlock`` (the
schedule core's dry run) reports it first. If the engine still stalls (it cannot for a schedule
that passed the dry run), the stall is reported the same way. Nothing ever hangs.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Mapping

from ..schedule import ActionKind, ChunkSpec, CommSemantics, DeadlockReport, Schedule, StageCostModel, check_deadlock
from ..schedule.ir import link_key, transfer_span
from .communicator import CommOp, Communicator
from .config import SimConfig
from .cost.base import StageTime, stage_time
from .entities import RankStats, SliceKind, TimelineSlice
from .errors import SimDeadlockError, SimError
from .events import Event, RankReadyEvent, TransferDoneEvent
from .idle import IdleCause, IdleLedger
from .result import SimResult

__all__ = ["Engine", "simulate_schedule"]


class Engine:
    """State of one simulation; ``run()`` executes it. Use ``simulate_schedule``."""

    def __init__(
        self,
        schedule: Schedule,
        cost: StageCostModel,
        config: SimConfig = SimConfig(),
        arrivals: Mapping[int, float] | None = None,
        admitted_at: Mapping[tuple[int, int], float] | None = None,
    ) -> None:
        self.schedule = schedule
        self.cost = cost
        self.config = config
        self.num_ranks = schedule.num_ranks
        self.stages = schedule.layout.stages
        self.last_stage = schedule.layout.num_stages - 1
        blocking = CommSemantics(schedule.comm_semantics) is CommSemantics.BLOCKING
        self.blocking_sends = blocking
        self.prepost = (not blocking) if config.prepost_recvs is None else config.prepost_recvs
        requests = schedule.requests
        self.arrival = {i: float(r.arrival) for i, r in enumerate(requests)}
        if arrivals is not None:
            self.arrival.update({int(k): float(v) for k, v in arrivals.items()})
        self.admitted_at = dict(admitted_at or {})
        self.chunks: dict[tuple[int, int], ChunkSpec] = {c.key: c for c in schedule.chunks}
        self.pc = [0] * self.num_ranks
        self.stats = [RankStats(rank) for rank in range(self.num_ranks)]
        self.timeline: list[TimelineSlice] = []
        self.data_ready: dict[tuple[int, int, int], float] = {}
        self.completion: dict[int, float] = {}
        self.release: dict[int, float] = {}
        self.waiting: list[tuple[CommOp, float] | None] = [None] * self.num_ranks
        self.rank_ops: list[dict[int, CommOp]] = [{} for _ in range(self.num_ranks)]
        self.op_comm: dict[int, Communicator] = {}
        self.communicators: dict[tuple[str, int, int], Communicator] = {}
        self.stage_totals = [0.0] * len(self.stages)
        self.num_transfers = 0
        # Time is accounted from the first arrival: before it there is no work to idle on.
        self.start_s = min(self.arrival.values(), default=0.0)
        self.idle = IdleLedger(self.num_ranks, self.start_s)
        self._build_communicators()

    # ------------------------------------------------------------------ setup
    def _build_communicators(self) -> None:
        for rank, actions in enumerate(self.schedule.rank_actions):
            for step, action in enumerate(actions):
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
        if self.prepost:
            for comm in self.communicators.values():
                for side in comm.ops.values():
                    self._propagate_prepost(side, 0, 0.0)

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
        for rank in range(self.num_ranks):
            heapq.heappush(heap, (0.0, next(counter), RankReadyEvent(0.0, rank)))
        for comm in self.communicators.values():
            for event in self._resolve(comm):
                heapq.heappush(heap, (event.time, next(counter), event))
        while heap:
            _, _, event = heapq.heappop(heap)
            for new in event.handle(self):
                heapq.heappush(heap, (new.time, next(counter), new))
        stalled = any(self.pc[r] < len(self.schedule.rank_actions[r]) for r in range(self.num_ranks))
        return self._result(self._stall_report() if stalled else None)

    def issue(self, rank: int, now: float) -> list[Event]:
        """Issue ``rank``'s actions from its program counter until one takes time or blocks."""
        actions = self.schedule.rank_actions[rank]
        events: list[Event] = []
        while self.pc[rank] < len(actions):
            step = self.pc[rank]
            action = actions[step]
            if action.kind is ActionKind.COMPUTE:
                if action.stage_index == 0:
                    released, start = self._start_time(action)
                    if start > now:
                        cause = IdleCause.RELEASE if released >= start else IdleCause.ADMISSION
                        self.idle.stopped(rank, cause)
                        return events + [RankReadyEvent(start, rank)]
                end = self._compute(rank, step, now)
                self.pc[rank] += 1
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
                self.waiting[rank] = (op, now)
                return events
            self.pc[rank] += 1
        self.stats[rank].busy_until = max(self.stats[rank].busy_until, now)
        return events

    def finish_transfer(self, comm: Communicator, index: int, now: float) -> list[Event]:
        """Transfer ``index`` on ``comm`` ended at ``now``: release the ranks it held."""
        events: list[Event] = []
        for op in (comm.ops[comm.low][index], comm.ops[comm.high][index]):
            waiting = self.waiting[op.rank]
            if waiting is None or waiting[0] is not op:
                continue
            self.waiting[op.rank] = None
            self._account_wait(op, waiting[1], now)
            self.pc[op.rank] += 1
            events.append(RankReadyEvent(now, op.rank))
        return events

    # ------------------------------------------------------------------ helpers
    def _resolve(self, comm: Communicator) -> list[Event]:
        """Time every transfer whose two ends are posted, in communicator order."""
        events: list[Event] = []
        while len(comm.ends) < comm.num_pairs:
            index = len(comm.ends)
            pair = comm.pair(index)
            if pair is None:
                break  # mismatched heads: a deadlock, reported by the stall check
            send, recv = pair
            if send.post_time is None or recv.post_time is None:
                break
            previous = comm.ends[-1] if comm.ends else 0.0
            stage_index, request_index, chunk_index = send.action.key
            chunk = self.chunks[(request_index, chunk_index)]
            start, end = transfer_span(max(send.post_time, recv.post_time), previous,
                                       self.cost.transfer_cost(self.stages[stage_index], chunk))
            comm.starts.append(start)
            comm.ends.append(end)
            self.num_transfers += 1
            if self.config.record_timeline:
                for op, kind in ((send, SliceKind.SEND), (recv, SliceKind.RECV)):
                    self.timeline.append(TimelineSlice(
                        op.rank, str(op.action), kind, start, end, comm.group,
                        stage_index, request_index, chunk_index))
            events.append(TransferDoneEvent(end, comm, index))
        return events

    def _compute(self, rank: int, step: int, now: float) -> float:
        action = self.schedule.rank_actions[rank][step]
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

    def _start_time(self, action) -> tuple[float, float]:
        """(release, start) of a stage-0 compute: the latest arrival of the requests in its
        forward, and the later of that and the time the controller admitted it."""
        released = 0.0
        for part in self.chunks[action.chunk_key].parts:
            request = part.request_index
            if request not in self.release:
                self.release[request] = self.arrival.get(request, 0.0)
            released = max(released, self.release[request])
        return released, max(released, self.admitted_at.get(action.chunk_key, 0.0))

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
            actions = self.schedule.rank_actions[rank]
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
    admitted_at: Mapping[tuple[int, int], float] | None = None,
) -> SimResult:
    """Execute ``schedule`` with durations from ``cost``; see the module docstring for the model.

    ``arrivals`` overrides request arrival times (seconds); ``admitted_at`` maps a chunk key to
    the time the controller admitted it into stage 0 (``Schedule.admission_times`` of a dry run
    on ``cost``'s durations).
    """
    config = config or SimConfig()
    if config.check_deadlock:
        report = check_deadlock(schedule)
        if report.deadlock:
            if config.raise_on_deadlock:
                raise SimDeadlockError(report.describe(schedule.rank_actions), report)
            return SimResult.deadlocked(schedule, report)
    engine = Engine(schedule, cost, config, arrivals, admitted_at)
    result = engine.run()
    if result.deadlock is not None and config.raise_on_deadlock:
        raise SimDeadlockError(result.deadlock.describe(schedule.rank_actions), result.deadlock)
    return result
