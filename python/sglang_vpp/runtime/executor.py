"""``RankExecutor``: one rank executing its action stream on real layers, with real hand-offs.

Data flow per action (stream from a ``control.PlanFeed``):

- ``<s>F<r>.<c>`` (compute): input = token ids (stage 0) or the hidden states of stage ``s-1``
  (received, or local at the fold: [Note: fold point has no comm]); ``StageModel.forward_stage``
  with the KV of (request, stage); the output is kept under key ``(s, r, c)`` for a send or the
  next local stage, or, on the last stage, appended to the request's outputs. The KV of
  (request, stage) is freed after the request's last chunk.
- ``<s>SEND_F<r>.<c>>peer@group``: ``comm.isend({"hidden": ...})``. ``blocking`` schedules (vpp)
  wait for completion; ``async`` ones go on and check the handle later.
- ``<s>RECV_F<r>.<c><peer@group``: wait for the (possibly pre-posted) ``comm.irecv`` and keep
  the tensor under ``(s, r, c)``.

Every wait is bounded (``Timeouts.comm_s``) and sliced, so an abort from the launcher (another
rank failed) stops this rank within half a second with a message naming the cause.

Receives are pre-posted for ``async`` schedules, in each link's issue order: a receive on link L
is posted early only if no send on L comes before it in the stream (per communicator, operations
pair in issue order; posting past a send would reorder the link). ``blocking`` schedules post
nothing early: they are rendezvous by definition.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import torch

from ..comm.base import CommHandle, PipelineCommunicator
from ..comm.errors import CommProtocolError, CommTimeoutError
from ..schedule import Action, ActionKind, CommSemantics, Layout
from .control import PlanFeed
from .models import KVCache, StageModel
from .records import ActionRecord
from .reference import prompt_tokens
from .spec import Device, FaultKind, FaultSpec, Timeouts

__all__ = ["RankExecutor", "RunAborted"]

_WAIT_SLICE_S = 0.5
_PREPOST_WINDOW = 4


class RunAborted(RuntimeError):
    """The launcher stopped this rank because another rank failed first."""


class RankExecutor:
    """Runs one rank's actions; see the module docstring."""

    def __init__(
        self,
        rank: int,
        layout: Layout,
        model: StageModel,
        comm: PipelineCommunicator | None,
        feed: PlanFeed,
        semantics: CommSemantics,
        *,
        device: Device = Device.CPU,
        timeouts: Timeouts | None = None,
        epoch: float = 0.0,
        token_seed: int = 0,
        prepost_recvs: bool = True,
        fault: FaultSpec | None = None,
        aborted: Callable[[], bool] = lambda: False,
        on_chunk_done: Callable[[int, int], None] | None = None,
    ) -> None:
        self.rank = rank
        self.layout = layout
        self.model = model
        self.comm = comm
        self.feed = feed
        self.blocking = CommSemantics(semantics) is CommSemantics.BLOCKING
        self.device = Device(device)
        self.torch_device = torch.device("cpu") if self.device is Device.CPU else next(model.parameters()).device
        self.timeouts = timeouts if timeouts is not None else Timeouts()
        self.epoch = epoch
        self.token_seed = token_seed
        self.prepost = prepost_recvs and not self.blocking
        self.fault = fault if fault is not None and fault.rank == rank else None
        self._aborted = aborted
        self._on_chunk_done = on_chunk_done
        self._last_stage_done = 0
        self.kv = KVCache(token_dim=0 if model.config.is_mla else 1)
        self.records: list[ActionRecord] = []
        self.outputs: dict[int, tuple[list[torch.Tensor], torch.Tensor | None]] = {}
        self._buffers: dict[tuple[int, int, int], torch.Tensor] = {}
        self._tokens: dict[int, torch.Tensor] = {}
        self._posted: dict[Action, tuple[CommHandle, float]] = {}
        self._pending_sends: list[tuple[CommHandle, ActionRecord]] = []
        self._done_at: dict[int, float] = {}
        self._recv_done_at: dict[str, float] = {}
        self.finished_s = 0.0
        self.drained_s = 0.0

    # ------------------------------------------------------------------ main loop
    @torch.inference_mode()
    def run(self) -> list[ActionRecord]:
        try:
            self.feed.start()
            self._run_stream()
        finally:
            self.feed.close()
        self.finished_s = self._now()
        for handle, _ in self._pending_sends:
            self._wait(handle, handle.action)
        self._reap_sends()
        self.drained_s = self._now()
        for record in self.records:
            if record.kind == ActionKind.SEND.value:
                record.done_s = self._done_at.get(record.index, record.end_s)
        return self.records

    def _run_stream(self) -> None:
        while True:
            action = self.feed.next_action(self._check_abort)
            if action is None:
                return
            self._maybe_fail(len(self.records))
            if action.kind is ActionKind.COMPUTE:
                self._compute(action)
            elif action.kind is ActionKind.SEND:
                self._send(action)
            else:
                self._recv(action)
            # The planner decides on real completions (an async send counts once posted).
            self.feed.done(self._now())
            self._reap_sends()
            if self.prepost:
                self._prepost_recvs()

    # ------------------------------------------------------------------ actions
    def _compute(self, action: Action) -> None:
        stage = self.layout.stages[action.stage_index]
        chunk = self.feed.chunks[action.chunk_key]
        parts = chunk.parts  # a batched forward: several requests' chunks, attention per request
        is_first, is_last = stage.stage_index == 0, stage.stage_index == self.layout.last_stage
        if is_first:
            pieces = [self._request_tokens(p.request_index)[p.start : p.end] for p in parts]
            inputs = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        else:
            key = (stage.stage_index - 1, chunk.request_index, chunk.chunk_index)
            if key not in self._buffers:
                raise CommProtocolError(
                    rank=self.rank, action=str(action),
                    detail=f"the input of {action} (output of stage {key[0]}) is neither local nor received; "
                    "the stream computes before its receive", fix="this is an executor or planner bug")
            inputs = self._buffers.pop(key)
        kv = [self.kv.for_stage(p.request_index, stage.stage_index, self.feed.lengths[p.request_index])
              for p in parts]
        start = self._now()
        self._sync()
        cpu = time.thread_time()
        wall = time.perf_counter()
        out = self.model.forward_stage(inputs, chunk, stage.layer_start, stage.layer_end, kv, is_first, is_last)
        self._sync()
        cost = time.thread_time() - cpu if self.device is Device.CPU else time.perf_counter() - wall
        for part in parts:
            if part.is_last:
                self.kv.release(part.request_index, stage.stage_index)
        if not is_last:
            self._buffers[(stage.stage_index, chunk.request_index, chunk.chunk_index)] = out.hidden
        self._record(action, start, cost_s=cost, num_tokens=chunk.total_tokens, prefix_len=chunk.start)
        if is_last:
            row = 0
            for part, logits in zip(parts, out.part_logits):
                pieces, known = self.outputs.setdefault(part.request_index, ([], None))
                pieces.append(out.hidden[row : row + part.num_tokens])
                self.outputs[part.request_index] = (pieces, logits if logits is not None else known)
                row += part.num_tokens
            self._last_stage_done += 1
            if self._on_chunk_done is not None:
                self._on_chunk_done(self._last_stage_done, len(self.feed.chunks))

    def _send(self, action: Action) -> None:
        assert self.comm is not None and action.peer is not None and action.group is not None
        tensor = self._buffers.pop(action.key)
        start = self._now()
        handle = self.comm.isend({"hidden": tensor}, action.peer, action.group, action=str(action))
        record = self._record(action, start, posted_s=start)
        index = record.index
        handle.add_done_callback(lambda _h, index=index: self._done_at.__setitem__(index, self._now()))
        if self.blocking:
            self._wait(handle, str(action))
            record.end_s = self._now()
            record.done_s = record.end_s
        else:
            self._pending_sends.append((handle, record))

    def _recv(self, action: Action) -> None:
        assert self.comm is not None and action.peer is not None and action.group is not None
        start = self._now()
        handle, posted = self._posted.pop(action, (None, start))
        if handle is None:
            handle = self._post_recv(action)
        data = self._wait(handle, str(action))
        assert data is not None
        hidden = data.get("hidden")
        chunk = self.feed.chunks[action.chunk_key]
        expected = (chunk.total_tokens, self.model.config.hidden_size)
        if not isinstance(hidden, torch.Tensor) or tuple(hidden.shape) != expected:
            got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
            raise CommProtocolError(
                rank=self.rank, peer=action.peer, group=action.group, action=str(action),
                detail=f"received hidden states of shape {got}, expected {expected}: the two ranks "
                "disagree about the stream", fix="ranks must run the same planner ops (control plane bug)")
        self._buffers[action.key] = hidden.to(self.torch_device)
        record = self._record(action, start, posted_s=posted)
        record.done_s = min(self._recv_done_at.pop(str(action), record.end_s), record.end_s)

    def _post_recv(self, action: Action) -> CommHandle:
        assert self.comm is not None and action.peer is not None and action.group is not None
        handle = self.comm.irecv(action.peer, action.group, action=str(action))
        text = str(action)
        handle.add_done_callback(lambda _h: self._recv_done_at.setdefault(text, self._now()))
        return handle

    def _prepost_recvs(self) -> None:
        """Post upcoming receives early, never past a send on the same link (module docstring)."""
        blocked: set[tuple[str | None, int | None]] = set()
        posted = len(self._posted)
        for action in list(self.feed.upcoming()):
            if posted >= _PREPOST_WINDOW:
                return
            link = (action.group, action.peer)
            if action.kind is ActionKind.SEND:
                blocked.add(link)
            elif action.kind is ActionKind.RECV and link not in blocked and action not in self._posted:
                self._posted[action] = (self._post_recv(action), self._now())
                posted += 1

    # ------------------------------------------------------------------ waiting and failure
    def _wait(self, handle: CommHandle, what: str) -> dict[str, Any] | None:
        """``handle.wait`` in slices, checking for an abort; a full ``comm_s`` of silence raises."""
        deadline = time.monotonic() + self.timeouts.comm_s
        while True:
            try:
                return handle.wait(min(_WAIT_SLICE_S, max(0.0, deadline - time.monotonic())))
            except CommTimeoutError as timeout:
                if handle.is_ready():
                    # Done after all: either its own failure (e.g. the transport deadline), reported
                    # as is, or it finished just as this slice gave up, which is no timeout.
                    failure = handle.exception()
                    if failure is None:
                        continue  # the next wait returns its result at once
                    if failure is timeout:
                        raise
                    raise failure
                self._check_abort()
                if time.monotonic() >= deadline:
                    raise CommTimeoutError(
                        rank=self.rank, peer=handle.peer, group=handle.group, action=what,
                        timeout_s=self.timeouts.comm_s,
                        detail=f"after {len(self.records)} executed actions the peer never paired this "
                        "operation (it is stuck, dead, or the two streams disagree)",
                        fix="read the peer rank's error; raise Timeouts.comm_s if a single compute can "
                        "take longer than the timeout") from None

    def _reap_sends(self) -> None:
        """Surface a failed asynchronous send now, not at the end of the run."""
        still = []
        for handle, record in self._pending_sends:
            if handle.is_ready():
                error = handle.exception()
                if error is not None:
                    raise error
            else:
                still.append((handle, record))
        self._pending_sends = still

    def _check_abort(self) -> None:
        self.feed.check()
        if self._aborted():
            raise RunAborted(
                f"rank {self.rank}: stopped by the launcher after {len(self.records)} actions because "
                "another rank failed (see that rank's error)"
            )

    def _maybe_fail(self, executed: int) -> None:
        fault = self.fault
        if fault is None or executed < fault.after_actions:
            return
        if fault.kind is FaultKind.KILL:
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind is FaultKind.RAISE:
            raise RuntimeError(f"rank {self.rank}: injected fault after {executed} actions (SGLANG_VPP_FAULT)")
        while True:  # HANG: stop making progress until the launcher kills us
            time.sleep(1.0)

    # ------------------------------------------------------------------ helpers
    def _request_tokens(self, request_index: int) -> torch.Tensor:
        if request_index not in self._tokens:
            length = self.feed.lengths[request_index]
            tokens = prompt_tokens(request_index, length, self.model.config.vocab_size, self.token_seed)
            self._tokens[request_index] = tokens.to(self.torch_device)
        return self._tokens[request_index]

    def _record(self, action: Action, start: float, **fields: Any) -> ActionRecord:
        record = ActionRecord(
            rank=self.rank, index=len(self.records), action=str(action), kind=action.kind.value,
            stage_index=action.stage_index, request_index=action.request_index,
            chunk_index=action.chunk_index, start_s=start, end_s=self._now(),
            group=action.group, peer=action.peer, **fields,
        )
        self.records.append(record)
        return record

    def _now(self) -> float:
        return time.perf_counter() - self.epoch

    def _sync(self) -> None:
        if self.device is Device.CUDA:
            torch.cuda.synchronize()
        elif self.device is Device.NPU:
            torch.npu.synchronize()  # type: ignore[attr-defined]

    def final_outputs(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """``{request: (hidden [n, H], logits [V])}`` on the rank holding the last stage."""
        out = {}
        for request, (pieces, logits) in self.outputs.items():
            assert logits is not None, f"request {request} never finished its last chunk"
            out[request] = (torch.cat(pieces).cpu(), logits.cpu())
        return out
