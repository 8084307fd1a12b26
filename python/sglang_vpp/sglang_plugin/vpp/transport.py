"""Point-to-point messages of the VPP loop over SGLang group coordinators, with timeouts.

Job: carry one ``Message`` (control events + hidden-state tensors) from a rank to a neighbour,
in order, on one direction group, without ever waiting forever.

Wire format of one message on (group, src -> dst), all in issue order (gloo and NCCL pair
operations per communicator in that order):

    int64[1] size of the pickled envelope        -> cpu (gloo) group
    uint8[size] pickled envelope (kind, seq, stage, events, tensor specs)
    one tensor per spec, on the device group (the cpu group for CPU tensors)

Receiving: every incoming channel has a pump thread that posts the receives and puts complete
messages (or the exception that ended it) on the rank's single inbox queue, tagged with the
channel direction. A gloo receive is only ready once someone waits on it, so readiness needs a
waiter: the pump is that waiter, and the scheduler thread polls the inbox instead.

Timeouts: every wait passes ``timeout``. A gloo wait that times out closes the pair for good,
so a timeout is fatal by design: ``CommTimeoutError`` ends the server (no fallback to stock PP).
Idle channels stay alive through heartbeats (see event_loop.py).
"""

from __future__ import annotations

import datetime
import logging
import pickle
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from .errors import CommTimeoutError

logger = logging.getLogger(__name__)

__all__ = ["Message", "Channel", "Inbox"]


@dataclass
class Message:
    """One hop of the pipeline."""

    kind: str
    """"step" (control events, plus hidden states when it admits a batch), "hidden" (fold-back
    hidden states of an admitted batch) or "heartbeat"."""
    seq: int = -1
    """Sequence number of the micro-batch the tensors belong to (-1: none)."""
    stage: int = -1
    """Virtual stage that produced ``tensors`` (-1: none)."""
    events: list = field(default_factory=list)
    """Scheduler events to replay, in rank 0's order (see event_loop.py)."""
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


class Inbox:
    """The merged receive queue of one rank: items are ``(direction, Message | Exception)``."""

    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()


class Channel:
    """One direction to or from one neighbour on one group coordinator."""

    def __init__(self, *, group: Any, group_name: str, direction: str, rank: int, peer: int, timeout_s: float) -> None:
        self.group = group
        self.group_name = group_name
        self.direction = direction
        self.rank = rank
        self.peer = peer
        """Peer's rank inside ``group`` (pipeline rank)."""
        self.timeout_s = timeout_s
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._pending: deque[tuple[Any, list[torch.Tensor]]] = deque()
        self._thread: threading.Thread | None = None
        self.bytes_sent = 0
        self.messages_sent = 0

    # ------------------------------------------------------------------ sending
    def send(self, message: Message, *, blocking: bool) -> None:
        """Post the message; with ``blocking`` wait until the peer has taken all of it."""
        specs = []
        tensors = []
        for name, tensor in message.tensors.items():
            tensor = tensor.contiguous()
            specs.append((name, tuple(tensor.shape), tensor.dtype, str(tensor.device)))
            tensors.append(tensor)
        envelope = (message.kind, message.seq, message.stage, message.events, specs)
        blob = torch.frombuffer(bytearray(pickle.dumps(envelope)), dtype=torch.uint8)
        size = torch.tensor([blob.numel()], dtype=torch.long)
        dst = self.group.ranks[self.peer]
        works = [
            dist.isend(size, dst, group=self.group.cpu_group),
            dist.isend(blob, dst, group=self.group.cpu_group),
        ]
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            comm = self.group.cpu_group if tensor.is_cpu else self.group.device_group
            works.append(dist.isend(tensor, dst, group=comm))
        self.bytes_sent += blob.numel() + sum(t.numel() * t.element_size() for t in tensors)
        self.messages_sent += 1
        keep = [size, blob, *tensors]
        if blocking:
            self._wait(works, f"send of {message.kind} seq {message.seq}")
        else:
            self._pending.append((works, keep))
            # Async sends complete once the peer's pump has posted its receives; reap old ones so
            # buffers are released, waiting (with the timeout) only on sends several messages old.
            while len(self._pending) > 8:
                old, _ = self._pending.popleft()
                self._wait(old, "an earlier asynchronous send")

    def flush(self) -> None:
        while self._pending:
            works, _ = self._pending.popleft()
            self._wait(works, "an asynchronous send")

    def _wait(self, works: list, action: str) -> None:
        for work in works:
            try:
                work.wait(timeout=self._timeout)
            except RuntimeError as exc:
                raise CommTimeoutError(
                    rank=self.rank, peer=self.peer, group=self.group_name, action=action, timeout_s=self.timeout_s
                ) from exc

    # ------------------------------------------------------------------ receiving
    def start_pump(self, inbox: Inbox) -> None:
        """Receive messages forever on a daemon thread and put them on ``inbox``."""
        assert self._thread is None
        self._thread = threading.Thread(
            target=self._pump, args=(inbox,), name=f"vpp-recv-{self.direction}-from-{self.peer}", daemon=True
        )
        self._thread.start()

    def _pump(self, inbox: Inbox) -> None:
        while True:
            try:
                message = self._recv_one()
            except BaseException as exc:  # noqa: BLE001 - handed to the scheduler thread
                inbox.queue.put((self.direction, exc))
                return
            inbox.queue.put((self.direction, message))

    def _recv_one(self) -> Message:
        src = self.group.ranks[self.peer]
        size = torch.empty(1, dtype=torch.long)
        self._wait([dist.irecv(size, src, group=self.group.cpu_group)], "the next message header")
        blob = torch.empty(int(size.item()), dtype=torch.uint8)
        self._wait([dist.irecv(blob, src, group=self.group.cpu_group)], "a message body")
        kind, seq, stage, events, specs = pickle.loads(blob.numpy().tobytes())
        tensors: dict[str, torch.Tensor] = {}
        for name, shape, dtype, device in specs:
            local = "cpu" if device == "cpu" else self.group.device
            tensor = torch.empty(shape, dtype=dtype, device=local)
            if tensor.numel() > 0:
                comm = self.group.cpu_group if tensor.is_cpu else self.group.device_group
                self._wait([dist.irecv(tensor, src, group=comm)], f"tensor {name} of seq {seq}")
            tensors[name] = tensor
        return Message(kind=kind, seq=seq, stage=stage, events=events, tensors=tensors)
