"""Point-to-point messages of the VPP loop, as a thin adapter over ``sglang_vpp.comm``.

Job: carry one ``Message`` (control events + hidden-state tensors) from a rank to a neighbour,
in order, on one direction group, without ever waiting forever. The wire, the per-link threads,
the ordering and the error classification are the comm layer's (docs/comm.md): the same
``Communicator`` runs on gloo (CPU), NCCL (CUDA) and HCCL (NPU), chosen by ``backend_for``.

One ``Message`` is one comm tensor dict:

    {"kind": str, "seq": int, "stage": int,          JSON metadata
     "events": uint8[n],                            pickled scheduler events (requests and sampled
                                                    outputs are not JSON), only when non-empty
     "t.<name>": Tensor, ...}                       hidden states, residual, ...

Directions: the loop always uses the communicator's two directional groups, "fwd" (r -> r+1)
and "bwd" (r+1 -> r), so every link carries one direction only and a receive kept posted on it
never holds a send back (comm links run their operations in issue order).

Receiving: every incoming channel keeps one ``irecv`` posted; its done-callback (on the comm
channel thread) puts the completed handle on the rank's single inbox queue, tagged with the
channel direction and stamped with its arrival time, and posts the next receive. The scheduler thread takes handles from the inbox
and calls ``wait`` (which raises the operation's ``CommTimeoutError`` / ``PeerDeadError``).

Timeouts: every caller wait passes ``--vpp-comm-timeout``; the comm layer bounds each operation
inside its thread by its transport timeout. A failed operation breaks its link for good, so a
comm error is fatal by design and ends the server (no fallback to stock PP). Idle links stay
alive through heartbeats (see event_loop.py).
"""

from __future__ import annotations

import itertools
import pickle
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_vpp.comm import CommConfig, CommHandle, Communicator, create_communicator
from sglang_vpp.schedule.controller import hand_off_groups
from sglang_vpp.schedule.factory import SERVER_NUM_GROUPS

__all__ = ["Message", "MessageLink", "Inbox", "GROUPS", "backend_for", "open_communicator"]

GROUPS = hand_off_groups(SERVER_NUM_GROUPS)  # one direction per link: a posted receive never holds a send back
_TENSOR_PREFIX = "t."
_MAX_PENDING_SENDS = 8


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "seq": self.seq, "stage": self.stage}
        if self.events:
            out["events"] = torch.frombuffer(bytearray(pickle.dumps(self.events)), dtype=torch.uint8)
        for name, tensor in self.tensors.items():
            out[_TENSOR_PREFIX + name] = tensor
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Message":
        blob = data.get("events")
        events = pickle.loads(blob.cpu().numpy().tobytes()) if blob is not None else []
        tensors = {k[len(_TENSOR_PREFIX):]: v for k, v in data.items() if k.startswith(_TENSOR_PREFIX)}
        return cls(kind=data["kind"], seq=int(data["seq"]), stage=int(data["stage"]), events=events, tensors=tensors)


def backend_for(device: Any) -> str:
    """The comm backend for the device the ranks compute on: gloo (CPU), nccl (CUDA), hccl (NPU)."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    return {"cuda": "nccl", "npu": "hccl"}.get(kind, "gloo")


def open_communicator(device: Any, pp_ranks: list[int], timeout_s: float,
                      all_pairs: list[tuple[int, int]] | None = None) -> Communicator:
    """Create this rank's communicator over the PP ranks (global ranks, pipeline order).

    Collective over the whole torch world (``new_group``): every rank calls it at the same point
    with the same ``all_pairs``, the neighbour pairs of every pipeline in the world (with
    ``--tp-size > 1`` there is one pipeline per TP index); None: this pipeline is the world's only one."""
    pairs = tuple(itertools.pairwise(pp_ranks))
    if all_pairs is not None:
        assert set(pairs) <= set(all_pairs), (pairs, all_pairs)
        pairs = tuple(all_pairs)
    return create_communicator(backend_for(device), CommConfig(group_names=GROUPS, timeout_s=timeout_s, pairs=pairs))


class Inbox:
    """The merged receive queue of one rank: items are ``(direction, CommHandle, arrived_s)`` of
    completed receives; ``take`` turns a handle into a ``Message`` (or raises its failure).

    ``arrived_s`` (``time.perf_counter``) and the time ``drain`` returns are read under one
    lock, so an item is in a drain exactly when it arrived before that drain's time: the trace
    (``--vpp-trace``) can then say which messages a rank saw at each choice, which is what
    ``check --trace --reproduce`` predicts."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ready = threading.Condition()
        self._items: deque[tuple[str, CommHandle, float]] = deque()

    def put(self, direction: str, handle: CommHandle) -> None:
        with self._ready:
            self._items.append((direction, handle, time.perf_counter()))
            self._ready.notify()

    def wait(self, timeout_s: float) -> float | None:
        """Block until an item is queued; the arrival time of the oldest, None on timeout."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._items, timeout=timeout_s):
                return None
            return self._items[0][2]

    def drain(self) -> tuple[float, list[tuple[str, CommHandle, float]]]:
        """(now, every item that arrived before now), oldest first."""
        with self._ready:
            now = time.perf_counter()
            items = list(self._items)
            self._items.clear()
        return now, items

    def get(self, timeout_s: float) -> tuple[str, CommHandle]:
        """The oldest item's (direction, handle); ``queue.Empty`` after ``timeout_s``."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._items, timeout=timeout_s):
                raise queue.Empty
            direction, handle, _ = self._items.popleft()
        return direction, handle

    def take(self, handle: CommHandle) -> Message:
        data = handle.wait(self.timeout_s)
        assert data is not None
        return Message.from_dict(data)


class MessageLink:
    """One direction to or from one neighbour on the communicator's group of that direction."""

    def __init__(self, *, comm: Communicator, direction: str, rank: int, peer: int, peer_rank: int,
                 timeout_s: float) -> None:
        self.comm = comm
        self.direction = direction
        self.rank = rank
        self.peer = peer
        """Peer's pipeline rank."""
        self.peer_rank = peer_rank
        """Peer's global rank (what the communicator addresses)."""
        self.timeout_s = timeout_s
        self._pending: deque[CommHandle] = deque()
        self._inbox: Inbox | None = None

    # ------------------------------------------------------------------ sending
    def send(self, message: Message, *, blocking: bool) -> None:
        """Post the message; with ``blocking`` wait until the peer has taken all of it."""
        action = f"send of {message.kind} seq {message.seq} to pp rank {self.peer}"
        handle = self.comm.isend(message.to_dict(), self.peer_rank, self.direction, action=action)
        if blocking:
            handle.wait(self.timeout_s)
            return
        self._pending.append(handle)
        # Reap finished sends (raising a failure at once); wait, with the timeout, only on sends
        # several messages old so their buffers are released.
        while self._pending and (self._pending[0].is_ready() or len(self._pending) > _MAX_PENDING_SENDS):
            self._pending.popleft().wait(self.timeout_s)

    def flush(self) -> None:
        while self._pending:
            self._pending.popleft().wait(self.timeout_s)

    # ------------------------------------------------------------------ receiving
    def start_pump(self, inbox: Inbox) -> None:
        """Keep one receive posted; each completed one goes to ``inbox`` and posts the next."""
        assert self._inbox is None
        self._inbox = inbox
        self._post_recv()

    def _post_recv(self) -> None:
        action = f"the next {self.direction} message from pp rank {self.peer}"
        self.comm.irecv(self.peer_rank, self.direction, action=action).add_done_callback(self._on_recv)

    def _on_recv(self, handle: CommHandle) -> None:
        # Runs on the comm channel thread: hand over, and post the next receive unless this link failed.
        assert self._inbox is not None
        self._inbox.put(self.direction, handle)
        if handle.exception() is None:
            self._post_recv()
