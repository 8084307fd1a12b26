"""The VPP scheduler loop: fold-back pipeline over SGLang's replicated schedulers.

Replaces ``event_loop_pp`` for ``--pp-mode vpp | vpp-async | vpp-pack`` (routed from
``_dispatch_event_loop_once``). Rank r runs virtual stages r and 2P-1-r.

Data flow of one micro-batch (P = 2):

    rank 0: schedule (events logged) -> s0 -> SEND step(events, hidden) --fwd--> rank 1
    rank 1: replay events (same batch) -> s1 -> s2 [Note: fold point has no comm]
            -> SEND hidden --bwd--> rank 0
    rank 0: s3 + sampling (Scheduler.run_batch) -> process outputs -> log ("result", ...)

Decisions follow the schedule core's policy (``sglang_vpp.schedule.get_policy(mode)``):

- order: ``FEED_PEER_FIRST`` (vpp-async, vpp-pack) admits and runs s0 of the next micro-batch
  before the fold-back stage of a returned one, so the transfer overlaps the peer's compute;
  ``OLDEST_FIRST`` (vpp) drains returned micro-batches first;
- communication: ``BLOCKING`` (vpp) waits for each send to complete; ``ASYNC`` posts sends.
  Every mode moves its messages over the ``sglang_vpp.comm`` communicator's two direction groups
  ("fwd", "bwd"), through the ``transport.py`` adapter;
- admission: at most ``in_flight_limit`` micro-batches (the planner's 2P-1) between stage 0
  and the end of the last stage; ``pack`` (vpp-pack) lets the next request's leading chunks
  into extra slots during a request's drain window (``packing.py``).

Every stage processes micro-batches in admission order, so a chunk's KV prefix on a stage is
always written before a later chunk reads it, and each channel is FIFO.

TP (``--tp-size > 1``): one such pipeline per TP index; before each choice the TP ranks of a
stage agree on how many messages every one of them holds (``tp_agreement.py``), so they run
the same stages in the same order. Heartbeats never enter that count: ``_poll`` handles them.

Liveness: every wait has the comm timeout. An idle rank 0 sends a heartbeat down the pipeline
every ``heartbeat_s``; the last rank echoes it back up, so no channel is silent for long.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from typing import Any

import torch

from sglang_vpp.schedule import CommSemantics, Priority

from sglang_vpp.sglang_plugin.accounting import RankAccounting
from .errors import CommTimeoutError, SchedulerDivergenceError, VppConfigError
from .packing import PackGate
from .replica import Replica, batch_signature, outputs_to_cpu
from .stage_runner import StageJob, run_stage
from .state import VppState
from .tp_agreement import SOLO
from .transport import Channel, Inbox, Message

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
        self.blocking = self.policy.comm_semantics is CommSemantics.BLOCKING
        self.pack = PackGate(state, scheduler) if self.policy.pack else None
        num_slots = self.config.in_flight_limit + (self.pack.extra_slots if self.pack else 0)
        self.replica = Replica(scheduler, num_slots, self.rank)
        self.num_slots = num_slots
        self.jobs: dict[int, StageJob] = {}
        self.acct = RankAccounting(self.rank, self.config.trace_dir)
        self.inbox = Inbox(self.config.comm_timeout_s)
        self.fwd_items: deque[Message] = deque()
        self.bwd_items: deque[Message] = deque()
        self.tp = state.tp_agreement or SOLO
        self._check_replicas_agree()
        self.fwd_out = self._channel("fwd", self.rank + 1) if self.rank + 1 < self.num_ranks else None
        self.bwd_out = self._channel("bwd", self.rank - 1) if self.rank > 0 else None
        for direction, peer in (("fwd", self.rank - 1), ("bwd", self.rank + 1)):
            if 0 <= peer < self.num_ranks:
                self._channel(direction, peer).start_pump(self.inbox)
        logger.info(
            "VPP loop: mode %s, rank %d of %d, stages %s, %d slots, %s sends over %s",
            self.config.mode, self.rank, self.num_ranks, self.layout.stages_of(self.rank), num_slots,
            "blocking" if self.blocking else "async", state.comm,
        )

    # ------------------------------------------------------------------ plumbing
    def _channel(self, direction: str, peer: int) -> Channel:
        return Channel(
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
        while True:
            try:
                if block:
                    direction, item = self.inbox.queue.get(timeout=self.config.comm_timeout_s)
                else:
                    direction, item = self.inbox.queue.get_nowait()
            except queue.Empty:
                if block:
                    peer = self.rank + 1 if self.jobs else self.rank - 1
                    raise inbox_timeout(self.rank, peer, action, self.config.comm_timeout_s) from None
                return
            message = self.inbox.take(item)
            if message.kind == "heartbeat":
                self._on_heartbeat(direction, message)
            else:
                (self.fwd_items if direction == "fwd" else self.bwd_items).append(message)
            block = False

    def _on_heartbeat(self, direction: str, message: Message) -> None:
        """Heartbeats keep links alive; they carry no work, so no TP agreement counts them."""

    def _agreed_ready(self, action: str) -> tuple[int, int]:
        """(fold-back, forward-sweep) messages held by every TP rank of this stage."""
        bwd, fwd = self.tp.ready([len(self.bwd_items), len(self.fwd_items)], action)
        return bwd, fwd

    def _compute(self, job: StageJob, stage: int, tensors: dict | None) -> Any:
        with self.acct.timed(stage, job.seq, job.is_prefill, job.num_tokens):
            return run_stage(self.s, job, stage, tensors)

    def _flush_channels(self) -> None:
        for channel in (self.fwd_out, self.bwd_out):
            if channel is not None:
                channel.flush()


def _new_job(seq: int, slot: int, batch: Any) -> StageJob:
    is_prefill = batch.forward_mode.is_extend()
    num_tokens = int(batch.extend_num_tokens or 0) if is_prefill else len(batch.reqs)
    return StageJob(seq=seq, slot=slot, batch=batch, is_prefill=is_prefill, num_tokens=num_tokens)


class LeaderLoop(_LoopBase):
    """Rank 0: reads requests, decides, runs the first and the last virtual stage, samples."""

    def __init__(self, scheduler: Any, state: VppState) -> None:
        super().__init__(scheduler, state)
        self.events: list[tuple] = []
        self.slot_seq: list[int | None] = [None] * self.num_slots
        self.cursor = 0
        self.next_seq = 0
        self.idle = True
        self.last_fwd_send = time.monotonic()
        self.ready_bwd = 0

    def run(self) -> None:
        s = self.s
        while not s.gracefully_exit:
            if self._step():
                continue
            if self.jobs:
                oldest = min(self.jobs)
                # A message held here but not yet by a TP peer: go round again (no new one may come).
                self._poll(block=not self.bwd_items, action=f"the fold-back hidden states of micro-batch {oldest}")
                continue
            self._idle_poll()
        self._send_control()
        self._flush_channels()

    def _step(self) -> bool:
        self._poll(block=False, action="")
        self.ready_bwd, _ = self._agreed_ready("the leader's next choice")
        if self.policy.priority is Priority.FEED_PEER_FIRST:
            return self._try_admit() or self._try_finish()
        return self._try_finish() or self._try_admit()

    # ------------------------------------------------------------------ admission
    def _ingest(self) -> None:
        requests = self.s.ingest_requests()
        if requests:
            self.events.append(("reqs", requests))
            self.replica.num_events += 1
            self.idle = False

    def _try_admit(self) -> bool:
        self._ingest()
        if self.idle or self.s._engine_paused or self.s.gracefully_exit:
            return False
        for _ in range(self.num_slots):
            slot = self.cursor
            if self.slot_seq[slot] is not None:
                return False  # the oldest slot is still in flight: stock PP's slot discipline
            if not self._slot_allowed(slot):
                return False
            batch = self.replica.schedule(slot)
            self.events.append(("sched", slot, batch_signature(batch)))
            self.cursor = (slot + 1) % self.num_slots
            if batch is not None:
                self._launch(slot, batch)
                return True
        if not self.jobs:
            self._enter_idle()
        return False

    def _slot_allowed(self, slot: int) -> bool:
        """Slots beyond the in-flight limit are packing slots, open only in a drain window."""
        in_flight = sum(seq is not None for seq in self.slot_seq)
        if in_flight < self.config.in_flight_limit:
            return True
        return self.pack is not None and self.pack.admit_extra(self.jobs)

    def _launch(self, slot: int, batch: Any) -> None:
        seq = self.next_seq
        self.next_seq += 1
        job = _new_job(seq, slot, batch)
        if self.pack is not None:
            self.pack.on_admit(job)
        result = self._compute(job, 0, None)
        tensors = result.pp_hidden_states_proxy_tensors.tensors
        message = Message(kind="step", seq=seq, stage=0, events=self.events, tensors=tensors)
        self.events = []
        self.fwd_out.send(message, blocking=self.blocking)
        self.last_fwd_send = time.monotonic()
        self.jobs[seq] = job
        self.slot_seq[slot] = seq

    # ------------------------------------------------------------------ the last stage
    def _try_finish(self) -> bool:
        if self.ready_bwd <= 0:
            return False
        self.ready_bwd -= 1
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
        if self.pack is not None:
            self.pack.on_finish(job)
        return True

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
        if self.pack is not None:
            self.acct.counters["num_packed"] = self.pack.num_packed
        self.acct.write()

    def _idle_poll(self) -> None:
        if self.events:
            self._send_control()
        if time.monotonic() - self.last_fwd_send >= self.config.heartbeat_s:
            self.fwd_out.send(Message(kind="heartbeat"), blocking=self.blocking)
            self.last_fwd_send = time.monotonic()
        self._ingest()
        if self.idle:
            time.sleep(0.002)

    def _send_control(self) -> None:
        if self.events:
            self.fwd_out.send(Message(kind="step", events=self.events), blocking=self.blocking)
            self.events = []
            self.last_fwd_send = time.monotonic()


class FollowerLoop(_LoopBase):
    """Ranks 1..P-1: replay rank 0's decisions, run two virtual stages per micro-batch."""

    def __init__(self, scheduler: Any, state: VppState) -> None:
        super().__init__(scheduler, state)
        self.down_stage = self.rank
        self.up_stage = self.last_stage - self.rank
        self.is_fold = self.rank == self.num_ranks - 1

    def run(self) -> None:
        s = self.s
        while not s.gracefully_exit:
            self._poll(block=not (self.fwd_items or self.bwd_items), action="the next message from rank 0's side")
            ready_bwd, ready_fwd = self._agreed_ready("the follower's next message")
            # Oldest first: a fold-back item always belongs to an older micro-batch than a
            # forward-sweep item, and both feed a peer.
            if ready_bwd:
                self._on_backward(self.bwd_items.popleft())
            elif ready_fwd:
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
            result = self._compute(job, self.up_stage, tensors)
            up = result.pp_hidden_states_proxy_tensors.tensors
            self.bwd_out.send(Message(kind="hidden", seq=job.seq, stage=self.up_stage, tensors=up), blocking=self.blocking)
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
