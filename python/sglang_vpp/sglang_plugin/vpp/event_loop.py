"""The VPP scheduler loop: fold-back pipeline over SGLang's replicated schedulers.

Replaces ``event_loop_pp`` for ``--pp-mode vpp | vpp-async | vpp-pack | vpp-taper | vpp-stream`` (routed from
``_dispatch_event_loop_once``). Rank r runs virtual stages r and 2P-1-r; with ``--vpp-fold fused`` the
last rank runs its two as one stage (one forward; ``schedule/layout.py``, [Note: fused fold]).

Data flow of one micro-batch (P = 2):

    rank 0: schedule (events logged) -> s0 -> SEND step(events, hidden) --fwd--> rank 1
    rank 1: replay events (same batch) -> s1 -> s2 [Note: fold point has no comm]
            -> SEND hidden --bwd--> rank 0
    rank 0: s3 + sampling (Scheduler.run_batch) -> process outputs -> log ("result", ...)

SGLang chooses which requests form the next micro-batch; the schedule core's ``Controller``
(``sglang_vpp.schedule.controller``, the one the planner and hence the simulator and the runtime
use) decides everything else:

- admission: rank 0 builds the next micro-batch, asks ``Controller.admission`` and holds the
  batch until the answer is yes or packed (in-flight limit, request barrier, packing window);
- order: every rank with two ready items (rank 0: stage 0 of the held batch and the fold-back
  stage of a returned one; a middle rank: its forward and its fold-back stage) runs
  ``Controller.pick``'s choice first;
- chunk size: SGLang's chunk-size hook asks ``Controller.next_chunk_size`` (``chunk_sizing.ControllerChunkSizer``);
  with ``auto``, rank 0 first gives the controller's sizer the prompt lengths waiting and in
  flight (``chunk_sizing.AutoSituation``; after the first, planned in a child process and applied
  when ready), which also sets the budget of a batch of new requests;
- communication: each link is a ``Controller.hand_off`` (group, peer, semantics). ``BLOCKING``
  (vpp) waits for each send to complete; ``ASYNC`` posts sends. Every mode moves its messages over
  the ``sglang_vpp.comm`` communicator's two direction groups ("fwd", "bwd": the server's
  controller is built with two groups), through the ``transport.py`` adapter.

Every decision is recorded with ``--vpp-trace`` (``accounting.py``) so ``sglang-vpp check
--trace`` can replay the controller offline and compare.

Every stage processes micro-batches in admission order, so a chunk's KV prefix on a stage is
always written before a later chunk reads it, and each channel is FIFO.

TP (``--tp-size > 1``): one such pipeline per TP index; before each choice the TP ranks of a
stage agree on how many messages every one of them holds (``tp_agreement.py``), so they run
the same stages in the same order. Heartbeats never enter that count: ``_poll`` handles them.

Liveness: every wait has the comm timeout. An idle rank 0 sends a heartbeat down the pipeline
every ``heartbeat_s`` (a quarter of the comm timeout when that is shorter); the last rank echoes
it back up, so no channel is silent for long.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from typing import Any

import torch

from sglang_vpp.schedule import GROUP_FORWARD, Admission, Controller, MicroBatch
from sglang_vpp.schedule.auto_size import AutoChunker

from sglang_vpp.sglang_plugin.accounting import RankAccounting
from sglang_vpp.trace_records import ADMIT, CHUNK, DECODE, HOLD, LEFT, PICK, RESIZE, micro_batch_record
from .chunk_sizing import AutoSituation, install_chunk_sizer, taper_note
from .decode_slots import DecodeRegrouper
from .errors import CommTimeoutError, SchedulerDivergenceError, VppConfigError
from .grammar_sync import install_grammar_decisions
from .pd_prefill import pd_prefill_for
from .replica import Replica, batch_signature, outputs_to_cpu
from .stage_runner import StageJob, run_stage
from .state import VppState
from .tp_agreement import SOLO
from .transport import MessageLink, Inbox, Message

logger = logging.getLogger(__name__)

__all__ = ["run_vpp_event_loop"]


def run_vpp_event_loop(scheduler: Any, state: VppState) -> None:
    """Entry point on every PP rank; returns when the scheduler exits gracefully."""
    from sglang.srt.utils import DynamicGradMode

    loop = LeaderLoop(scheduler, state) if state.rank == 0 else FollowerLoop(scheduler, state)
    DynamicGradMode()(loop.run)()


def inbox_timeout(rank: int, peer: int, action: str, timeout_s: float) -> CommTimeoutError:
    """The error of a scheduler-thread wait that got no message in time (names the fix)."""
    return CommTimeoutError(
        rank=rank, peer=peer, group="fwd/bwd", action=action, timeout_s=timeout_s,
        detail=f"no message from pp rank {peer} while waiting for {action}",
        fix="the peer crashed, hangs, or one stage takes longer than the timeout: check the peer's log; "
        "for very long chunks raise --vpp-comm-timeout (SGLANG_VPP_COMM_TIMEOUT_S)",
    )  # fmt: skip


class _LoopBase:
    def __init__(self, scheduler: Any, state: VppState) -> None:
        assert state.layout is not None and state.rank is not None
        self.s = scheduler
        self.state = state
        self.config = state.config
        self.policy = state.config.policy
        self.layout = state.layout
        self.rank = state.rank
        self.num_ranks = state.layout.num_ranks
        self.last_stage = state.layout.last_stage
        chunk_size = int(getattr(scheduler, "chunked_prefill_size", 0) or 0)
        self.tp = state.tp_agreement or SOLO
        self.pd = pd_prefill_for(scheduler, self.rank, self.tp)  # PD prefill server: pd_prefill.py
        self.controller = state.build_controller(chunk_size, decodes=self.pd is None)
        note = taper_note(self.controller, chunk_size)
        if note is not None and self.rank == 0:
            logger.warning(note)
        self.blocking = self.controller.blocking
        num_slots = self.controller.limits.slots
        self.replica = Replica(scheduler, num_slots, self.rank)
        self.replica.grammar = install_grammar_decisions(self.rank)
        self.num_slots = num_slots
        self.jobs: dict[int, StageJob] = {}
        self.acct = RankAccounting(self.rank, self.config.trace_dir)
        if self.controller.decode.regroups:  # decode in stock PP's count of micro-batches
            self.replica.regroup = DecodeRegrouper(scheduler, self.controller,
                                                   functools.partial(self.acct.decision, DECODE))
        self.acct.controller = state.controller_inputs(self.controller)
        if isinstance(self.controller.chunker, AutoChunker):  # check --trace replays each size
            self.controller.chunker.on_choice = functools.partial(self.acct.decision, CHUNK)
            self.controller.chunker.history = None  # a server's choices go to its trace (resize records)
            self.replica.auto = AutoSituation(scheduler, self.controller, functools.partial(self.acct.decision, RESIZE))
        logger.info("VPP controller: rank %d estimates stage costs with %s", self.rank, state.cost_source())
        self.inbox = Inbox(self.config.comm_timeout_s)
        # When this rank last polled, began to wait, and what ended the wait (trace_records).
        self._poll_s: float | None = None
        self._idle_s: float | None = None
        self._woke_s: float | None = None
        self.fwd_items: deque[Message] = deque()
        self.bwd_items: deque[Message] = deque()
        self.replica.pd = self.pd
        self._check_replicas_agree()
        # Every link this rank's stages send on and receive from, as the controller's hand-offs.
        self.fwd_out: MessageLink | None = None
        self.bwd_out: MessageLink | None = None
        for stage in self.layout.stages_of(self.rank):
            outgoing = self.controller.hand_off(stage)
            if outgoing is not None:
                link = self._channel(outgoing.group, outgoing.dst_rank)
                if outgoing.group == GROUP_FORWARD:  # a server's links carry one direction each
                    self.fwd_out = link
                else:
                    self.bwd_out = link
            incoming = self.controller.hand_off(stage - 1) if stage > 0 else None
            if incoming is not None:
                self._channel(incoming.group, incoming.src_rank).start_pump(self.inbox)
        # SGLang sizes each continuing request's next chunk through this hook (VPP refuses
        # --enable-dynamic-chunking, so the slot is free): the controller decides it.
        install_chunk_sizer(scheduler, self.controller)
        logger.info(
            "VPP loop: mode %s, rank %d of %d, stages %s, %d slots, %s sends over %s",
            self.config.mode, self.rank, self.num_ranks, self.layout.stages_of(self.rank), num_slots,
            "blocking" if self.blocking else "async", state.comm,
        )

    # ------------------------------------------------------------------ plumbing
    def _channel(self, direction: str, peer: int) -> MessageLink:
        return MessageLink(
            comm=self.state.comm, direction=direction, rank=self.rank, peer=peer,
            peer_rank=self.state.pp_group.ranks[peer], timeout_s=self.config.comm_timeout_s,
        )

    def _check_replicas_agree(self) -> None:
        """Replicated schedulers need identical pools and limits on every rank."""
        s = self.s
        mine = {
            "max_total_num_tokens": int(s.max_total_num_tokens),
            "max_running_requests": int(getattr(s, "max_running_requests", 0) or 0),
            "chunked_prefill_size": int(getattr(s, "chunked_prefill_size", 0) or 0),
            "page_size": int(getattr(s, "page_size", 1) or 1),
        }
        group = self.state.pp_group
        everyone = [None] * group.world_size
        torch.distributed.all_gather_object(everyone, mine, group=group.cpu_group)
        if any(other != mine for other in everyone):
            raise VppConfigError(
                f"--pp-mode {self.config.mode}: the PP ranks sized their schedulers differently: {everyone}. "
                "Pass --max-total-tokens (and --max-running-requests) so every rank gets the same KV pool."
            )

    def _poll(self, block: bool, action: str) -> None:
        """Move arrived messages to the direction queues; with ``block`` wait for at least one."""
        if block:
            self._mark_idle()
            if self.inbox.wait(self.config.comm_timeout_s) is None:
                peer = self.rank + 1 if self.jobs else self.rank - 1
                raise inbox_timeout(self.rank, peer, action, self.config.comm_timeout_s)
        polled, items = self.inbox.drain()
        self._poll_s = polled - self.acct.origin
        for direction, item, arrived in items:
            message = self.inbox.take(item)
            if message.kind == "heartbeat":
                self._on_heartbeat(direction, message)
                continue
            (self.fwd_items if direction == "fwd" else self.bwd_items).append(message)
            if message.seq >= 0:
                self.acct.arrival(message.stage, message.seq, arrived)
                if block and self._woke_s is None:
                    self._woke_s = arrived - self.acct.origin

    def _mark_idle(self) -> None:
        """Nothing to run since the last compute: the rank waits from now on."""
        if self._idle_s is None:
            self._idle_s = self.acct.now()

    def _on_heartbeat(self, direction: str, message: Message) -> None:
        """Heartbeats keep links alive; they carry no work, so no TP agreement counts them."""

    def _agreed_ready(self, action: str) -> tuple[int, int]:
        """(fold-back, forward-sweep) messages held by every TP rank of this stage."""
        bwd, fwd = self.tp.ready([len(self.bwd_items), len(self.fwd_items)], action)
        return bwd, fwd

    def _compute(self, job: StageJob, stage: int, tensors: dict | None) -> Any:
        waits = {"poll_s": self._poll_s, "idle_s": self._idle_s, "woke_s": self._woke_s}
        self._idle_s = self._woke_s = None
        with self.acct.timed(stage, job.seq, job.is_prefill, job.num_tokens, **waits):
            return run_stage(self.s, job, stage, tensors)

    def _pick(self, ready: list[tuple[int, int]]) -> tuple[int, int]:
        """The controller's choice among this rank's ready ``(stage, seq)`` items (recorded)."""
        if len(ready) == 1:
            return ready[0]
        chosen = self.controller.pick(self.rank, ready)
        self.acct.decision(PICK, ready=[list(item) for item in ready], chosen=list(chosen))
        return chosen

    def _flush_channels(self) -> None:
        for channel in (self.fwd_out, self.bwd_out):
            if channel is not None:
                channel.flush()


def _new_job(seq: int, slot: int, batch: Any) -> StageJob:
    is_prefill = batch.forward_mode.is_extend()
    num_tokens = int(batch.extend_num_tokens or 0) if is_prefill else len(batch.reqs)
    return StageJob(seq=seq, slot=slot, batch=batch, is_prefill=is_prefill, num_tokens=num_tokens)


class _Held:
    """A micro-batch SGLang built that waits for the controller's admission."""

    def __init__(self, slot: int, batch: Any, micro_batch: MicroBatch) -> None:
        self.slot, self.batch, self.micro_batch = slot, batch, micro_batch
        self.hold_recorded = False


def micro_batch_of(seq: int, batch: Any, chunked_req: Any) -> MicroBatch:
    """The controller's view of an SGLang batch, right after ``get_next_batch_to_run`` built it."""
    rids = frozenset(req.rid for req in batch.reqs)
    if not batch.forward_mode.is_extend():
        return MicroBatch(seq, rids, start=0, num_tokens=len(batch.reqs), ends_request=True, is_prefill=False)
    prefix = max((int(x) for x in (batch.prefix_lens or [0])), default=0)
    continues = chunked_req is not None and chunked_req.rid in rids
    return MicroBatch(seq, rids, start=prefix, num_tokens=max(1, int(batch.extend_num_tokens or 0)),
                      ends_request=not continues)


class LeaderLoop(_LoopBase):
    """Rank 0: reads requests, runs the first and the last virtual stage, samples; the controller
    decides admission and order."""

    def __init__(self, scheduler: Any, state: VppState) -> None:
        super().__init__(scheduler, state)
        self.events: list[tuple] = []
        self.slot_seq: list[int | None] = [None] * self.num_slots
        self.cursor = 0
        self.next_seq = 0
        self.idle = True
        self.held: _Held | None = None
        self.last_fwd_send = time.monotonic()

    def run(self) -> None:
        try:
            self._run()
        finally:  # exiting or failing, the auto planner's process goes with the loop
            if self.replica.auto is not None:
                try:
                    self.replica.auto.close()
                except Exception:  # never hide the loop's own error behind the planner's
                    logger.exception("VPP rank 0: stopping the auto planner process failed")

    def _run(self) -> None:
        s = self.s
        while not s.gracefully_exit:
            if self._step():
                continue
            self._mark_idle()
            if self.jobs:
                oldest = min(self.jobs)
                # A message held here but not yet by a TP peer: go round again (no new one may come).
                self._poll(block=not self.bwd_items, action=f"the fold-back hidden states of micro-batch {oldest}")
                continue
            self._idle_poll()
        self.held = None  # built but never admitted: the server is exiting
        self._send_control()
        self._flush_channels()

    def _step(self) -> bool:
        self._poll(block=False, action="")
        ready_bwd, _ = self._agreed_ready("the leader's next choice")
        # Every step ingests: aborts, pauses and a PD prefill's bootstrap and transfer polls ride
        # on it (skipping it on busy steps saved nothing measurable, docs/cpu-measurements.md).
        self._ingest()
        held = self._admissible()
        ready = self.controller.ready_items(self.rank, self.bwd_items[0].seq if ready_bwd else None,
                                            None if held is None else held.micro_batch.seq)
        if not ready:
            return False
        stage, _ = self._pick(ready)
        if stage == 0:
            self._launch()
        else:
            self._finish()
        return True

    # ------------------------------------------------------------------ admission
    def _ingest(self) -> None:
        requests = self.s.ingest_requests()
        if requests:
            self.events.append(("reqs", requests))
            self.replica.num_events += 1
            self.idle = False
        if self.pd is not None and self.pd.leader_poll(self.events):
            self.idle = False  # requests bootstrapped or released: a scheduling turn follows

    def _admissible(self) -> _Held | None:
        """The held micro-batch (built first if none is) when the controller admits it now."""
        if self.s._engine_paused or self.s.gracefully_exit:
            return None
        held = self.held or self._build()
        if held is None:
            return None
        if self.controller.admission(held.micro_batch) is Admission.NO:
            if not held.hold_recorded:
                self.acct.decision(HOLD, **micro_batch_record(held.micro_batch))
                held.hold_recorded = True
            return None
        return held

    def _build(self) -> _Held | None:
        """Let SGLang build the next micro-batch in the next free slot (stock PP's slot order)."""
        if self.idle:
            return None
        for _ in range(self.num_slots):
            slot = self.cursor
            if self.slot_seq[slot] is not None:
                return None  # the oldest slot is still in flight
            if self.replica.auto is not None:  # the size travels ahead of the batch it sizes
                self.replica.auto.before_schedule(self.events)
            batch = self.replica.schedule(slot)
            self.events.extend(self.replica.grammar.take())  # read by the followers' same call
            self.events.append(("sched", slot, batch_signature(batch)))
            self.cursor = (slot + 1) % self.num_slots
            if batch is not None:
                self.held = _Held(slot, batch, micro_batch_of(self.next_seq, batch, self.s.chunked_req))
                self.acct.build(self.next_seq, slot, self._poll_s)
                return self.held
        # A request waiting on its grammar becomes schedulable when a compile thread finishes, not
        # when a message comes: stay out of idle (which waits for requests) until it has.
        if not self.jobs and not self.s.grammar_manager.has_waiting_grammars():
            self._enter_idle()
        return None

    def _launch(self) -> None:
        held, self.held = self.held, None
        assert held is not None
        decision = self.controller.admission(held.micro_batch)
        self.controller.on_admitted(held.micro_batch, decision)
        self.acct.decision(ADMIT, decision=str(decision), **micro_batch_record(held.micro_batch))
        seq = self.next_seq
        self.next_seq += 1
        job = _new_job(seq, held.slot, held.batch)
        result = self._compute(job, 0, None)
        tensors = result.pp_hidden_states_proxy_tensors.tensors
        message = Message(kind="step", seq=seq, stage=0, events=self.events, tensors=tensors)
        self.events = []
        self.fwd_out.send(message, blocking=self.blocking)
        self.last_fwd_send = time.monotonic()
        self.jobs[seq] = job
        self.slot_seq[held.slot] = seq

    # ------------------------------------------------------------------ the last stage
    def _finish(self) -> None:
        message = self.bwd_items.popleft()
        oldest = min(self.jobs)
        if message.seq != oldest or message.stage != self.last_stage - 1:
            raise SchedulerDivergenceError(
                f"VPP rank 0: expected fold-back hidden states of micro-batch {oldest} from stage "
                f"{self.last_stage - 1}, got micro-batch {message.seq} from stage {message.stage}"
            )
        job = self.jobs.pop(oldest)
        result = self._compute(job, self.last_stage, message.tensors)
        outputs = outputs_to_cpu(self.s._pp_prepare_tensor_dict(result, job.batch))
        self.replica.apply_result(job.slot, outputs)
        self.events.append(("result", job.slot, outputs))
        self.slot_seq[job.slot] = None
        self.controller.on_left(job.seq)
        self.acct.decision(LEFT, seq=job.seq)

    def _on_heartbeat(self, direction: str, message: Message) -> None:
        """The pipeline's echo of rank 0's own heartbeat: nothing to do."""

    # ------------------------------------------------------------------ idle
    def _enter_idle(self) -> None:
        """A full turn of the slots found no work and nothing is in flight."""
        self.idle = True
        self.replica.idle()
        self.events.append(("idle",))
        self._send_control()
        self.acct.counters["num_micro_batches"] = self.next_seq
        self.acct.counters["num_packed"] = self.controller.num_packed
        if self.replica.regroup is not None:
            self.acct.counters["num_aborted_while_held"] = self.replica.regroup.num_aborted_while_held
        self.acct.write()

    def _idle_poll(self) -> None:
        if self.events:
            self._send_control()
        # An idle follower waits the comm timeout for its next message: beat well within it,
        # whatever timeout was given (it may be below SGLANG_VPP_HEARTBEAT_S).
        interval = min(self.config.heartbeat_s, self.config.comm_timeout_s / 4)
        if time.monotonic() - self.last_fwd_send >= interval:
            self.fwd_out.send(Message(kind="heartbeat"), blocking=self.blocking)
            self.last_fwd_send = time.monotonic()
        self._ingest()
        if self.idle:
            time.sleep(0.002)

    def _send_control(self) -> None:
        # A held batch's "sched" event travels with its hidden states (followers launch the batch
        # of the last "sched" event of that message), so control messages wait for it.
        if self.events and self.held is None:
            self.fwd_out.send(Message(kind="step", events=self.events), blocking=self.blocking)
            self.events = []
            self.last_fwd_send = time.monotonic()


class FollowerLoop(_LoopBase):
    """Ranks 1..P-1: replay rank 0's decisions, run two virtual stages per micro-batch (the last
    rank one, under a fused fold)."""

    def __init__(self, scheduler: Any, state: VppState) -> None:
        super().__init__(scheduler, state)
        stages = self.layout.stages_of(self.rank)
        self.down_stage, self.up_stage = stages[0], stages[-1]  # one stage on a fused fold rank
        self.is_fold = self.rank == self.layout.fold_rank

    def run(self) -> None:
        s = self.s
        while not s.gracefully_exit:
            self._poll(block=not (self.fwd_items or self.bwd_items), action="the next message from rank 0's side")
            ready_bwd, ready_fwd = self._agreed_ready("the follower's next message")
            # Control-only messages carry no stage work: pass them on first.
            if ready_fwd and self.fwd_items[0].seq < 0:
                self._on_forward(self.fwd_items.popleft())
                continue
            ready = self.controller.ready_items(self.rank, self.bwd_items[0].seq if ready_bwd else None,
                                                self.fwd_items[0].seq if ready_fwd else None)
            if not ready:
                continue
            # By queue, not by stage: the last rank's one stage under a fused fold is both.
            if ready_bwd and self._pick(ready) == ready[0]:
                self._on_backward(self.bwd_items.popleft())
            else:
                self._on_forward(self.fwd_items.popleft())
        self._flush_channels()

    def _on_heartbeat(self, direction: str, message: Message) -> None:
        """Pass rank 0's heartbeat down the pipeline; the last rank echoes it back up."""
        if direction == "fwd":
            target = self.fwd_out if self.fwd_out is not None else self.bwd_out
        else:
            target = self.bwd_out
        target.send(Message(kind="heartbeat"), blocking=self.blocking)

    def _on_forward(self, message: Message) -> None:
        batch, slot = None, None
        for event in message.events:
            result = self.replica.replay(event)
            if event[0] == "sched":
                batch, slot = result, event[1]
            elif event[0] == "idle" and not self.jobs:
                self.acct.write()
        if message.seq < 0:
            if self.fwd_out is not None:
                self.fwd_out.send(message, blocking=self.blocking)
            return
        assert batch is not None, f"rank {self.rank}: step {message.seq} carries hidden states but no batch"
        self.replica.mark_launched(batch)
        job = _new_job(message.seq, slot, batch)
        result = self._compute(job, self.down_stage, message.tensors)
        tensors = result.pp_hidden_states_proxy_tensors.tensors
        if self.is_fold:  # [Note: fold point has no comm]
            if self.up_stage != self.down_stage:  # a fused fold ran both layer ranges in one forward
                result = self._compute(job, self.up_stage, tensors)
                tensors = result.pp_hidden_states_proxy_tensors.tensors
            self.bwd_out.send(Message(kind="hidden", seq=job.seq, stage=self.up_stage, tensors=tensors),
                              blocking=self.blocking)
            return
        self.jobs[job.seq] = job
        forward = Message(kind="step", seq=job.seq, stage=self.down_stage, events=message.events, tensors=tensors)
        self.fwd_out.send(forward, blocking=self.blocking)

    def _on_backward(self, message: Message) -> None:
        job = self.jobs.pop(message.seq, None)
        if job is None or message.stage != self.up_stage - 1:
            raise SchedulerDivergenceError(
                f"VPP rank {self.rank}: fold-back hidden states of micro-batch {message.seq} from stage "
                f"{message.stage} do not match any batch waiting for stage {self.up_stage}"
            )
        result = self._compute(job, self.up_stage, message.tensors)
        up = result.pp_hidden_states_proxy_tensors.tensors
        self.bwd_out.send(Message(kind="hidden", seq=job.seq, stage=self.up_stage, tensors=up), blocking=self.blocking)
