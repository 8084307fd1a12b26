"""The simulator: the schedule core's engine (``schedule/engine.py``) with the accounting of a run.

``SimEngine`` runs the core engine, given streams or live, on a hardware cost model and keeps
what the simulator reports: per-rank compute, exposed TP and PP communication, host overhead,
bubble split by cause (``idle.IdleLedger``), per-request TTFT and, optionally, a timeline. The
engine decides nothing and neither does the accounting: the order of every rank's work is the
controller's; the execution model (links, pre-posted receives, blocking sends) is the core
engine's module docstring.

- ``simulate_live(planner, durations)``: the controller decides at each instant of the
  simulation, as it would in a server; the streams it emitted are deadlock-checked afterwards.
- ``simulate_schedule(schedule, cost)``: streams given in advance (a runtime's or a server's
  recorded execution re-timed) run exactly as given.

Accounting model:

- A compute takes the cost model's stage time (math + exposed TP collectives + host overhead,
  see ``cost.base.StageTime``).
- Time a rank is held by a comm action is exposed communication from the moment the data it
  carries was produced (a blocking send: from the moment its copy starts, i.e. the receiver has
  posted); before that it is bubble. A live rank that ran out of work waits on the action the
  controller gives it next from the moment it ran out, as it would on the same stream given in
  advance. Every bubble interval is charged to its cause (``idle.IdleLedger``: fill, upstream
  wait, rendezvous, admission, release, host scheduling gap, drain).
"""

from __future__ import annotations

from typing import Mapping

from ..schedule import ActionKind, ChunkSpec, DeadlockReport, Engine, Planner, Schedule, StageCostModel, check_deadlock
from ..schedule.ir import Action
from ..schedule.layout import StageSpec
from ..schedule.links import Link, LinkOp
from .config import SimConfig
from .cost.base import StageTime, stage_time
from .entities import RankStats, SliceKind, TimelineSlice
from .errors import SimDeadlockError, SimError
from .idle import IdleCause, IdleLedger
from .result import SimResult

__all__ = ["SimEngine", "simulate_live", "simulate_schedule"]


class SimEngine(Engine):
    """The core engine plus the simulator's accounting; ``run()`` executes it and returns the
    ``SimResult``. Use ``simulate_schedule`` or ``simulate_live``."""

    def __init__(
        self,
        schedule: Schedule | None,
        cost: StageCostModel,
        config: SimConfig = SimConfig(),
        arrivals: Mapping[int, float] | None = None,
        planner: Planner | None = None,
    ) -> None:
        self.config = config
        try:
            super().__init__(schedule, cost, planner=planner, prepost_recvs=config.prepost_recvs, arrivals=arrivals)
        except ValueError as error:
            raise SimError(str(error)) from error
        self.stats = [RankStats(rank) for rank in range(self.num_ranks)]
        self.timeline: list[TimelineSlice] = []
        self.stage_totals = [0.0] * len(self.stages)
        self.idle = IdleLedger(self.num_ranks, self.start_s)

    def run(self) -> SimResult:
        return self._result(self.execute())

    # ------------------------------------------------------------------ accounting hooks
    def _compute_time(self, rank: int, action: Action, stage: StageSpec, chunk: ChunkSpec, start: float) -> float:
        parts: StageTime = stage_time(self.cost, stage, chunk)
        end = start + parts.total_s
        stats = self.stats[rank]
        stats.compute_s += parts.compute_s
        stats.exposed_tp_comm_s += parts.tp_comm_s
        stats.overhead_s += parts.overhead_s
        stats.num_computes += 1
        stats.busy_until = end
        self.idle.compute(rank, start, end, parts.overhead_s)
        self.stage_totals[action.stage_index] += parts.total_s
        if self.config.record_timeline:
            self.timeline.append(TimelineSlice(
                rank, str(action), SliceKind.COMPUTE, start, end, None, action.stage_index,
                action.request_index, action.chunk_index,
                {"compute_s": parts.compute_s, "tp_comm_s": parts.tp_comm_s, "overhead_s": parts.overhead_s,
                 "tokens": chunk.total_tokens, "prefix": chunk.start,
                 "requests": [part.request_index for part in chunk.parts]}))
        return parts.total_s

    def _admission_wait(self, rank: int, released: float, start: float) -> None:
        self.idle.stopped(rank, IdleCause.RELEASE if released >= start else IdleCause.ADMISSION)

    def _ran_out(self, rank: int, now: float) -> None:
        self.stats[rank].busy_until = max(self.stats[rank].busy_until, now)

    def _transfer_timed(self, link: Link, send: LinkOp, receiver: int, received: Action, start: float,
                        end: float) -> None:
        if not self.config.record_timeline:
            return
        stage_index, request_index, chunk_index = send.action.key
        for rank, action, kind in ((send.rank, send.action, SliceKind.SEND), (receiver, received, SliceKind.RECV)):
            self.timeline.append(TimelineSlice(rank, str(action), kind, start, end, link.group,
                                               stage_index, request_index, chunk_index))

    def _held(self, op: LinkOp, start: float, end: float) -> None:
        stats = self.stats[op.rank]
        if op.action.kind is ActionKind.SEND:
            # A blocking send: its data is there, but the copy starts only once the receiver has
            # posted (a rendezvous); the wait before that is idle, the copy exposed comm.
            produced = self.op_link[id(op)].starts[op.index]
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

    # ------------------------------------------------------------------ result
    def _result(self, deadlock: DeadlockReport | None) -> SimResult:
        transfer_end = max((link.ends[-1] for link in self.links.values() if link.ends), default=0.0)
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
    result = SimEngine(schedule, cost, config, arrivals).run()
    if result.deadlock is not None and config.raise_on_deadlock:
        raise SimDeadlockError(result.deadlock.describe(schedule.rank_actions), result.deadlock)
    return result


def simulate_live(planner: Planner, durations: StageCostModel, config: SimConfig | None = None) -> SimResult:
    """Run the work submitted to ``planner`` (seeing transfers; more may follow from its
    completion callback) on the engine: the controller decides at each instant of the
    simulation, as it would in a server, with the durations ``durations`` gives. The streams it
    emitted are checked afterwards (``check_deadlock``); ``SimResult.deadlock`` reports a stall of
    the streams. SimError when the planner holds work it never places (no rank blocked)."""
    config = config or SimConfig()
    engine = SimEngine(None, durations, config, planner=planner)
    result = engine.run()
    if result.deadlock is not None and not engine.streams_deadlock and not result.deadlock.blocked:
        # Every rank ran all it was given and the planner holds work it does not place: not a
        # deadlock of the streams, a controller that never lets the work in.
        raise SimError(f"the simulation stalled with no rank blocked: {planner.stuck_state()}")
    if result.deadlock is None and config.check_deadlock:
        report = check_deadlock(engine.schedule)
        if report.deadlock:
            result = SimResult.deadlocked(engine.schedule, report)
    if result.deadlock is not None and config.raise_on_deadlock:
        raise SimDeadlockError(result.deadlock.describe(engine.schedule.rank_actions), result.deadlock)
    return result
