"""A stand-in for NCCL/HCCL hardware, built on gloo: ``DoubleDeviceApi``.

It implements ``DeviceApi`` so that the real ``NcclBackend`` / ``HcclBackend`` code (group options,
communicator names, streams, events, batched exchange) runs on a CPU-only machine. It stands in
for the *hardware*, not for our code, and enforces what the hardware documents:

- **Streams are in-order device queues** (``DoubleStream``: one thread per stream). A transfer
  holds its stream until it completes, so later work on that stream waits, as on a GPU/NPU.
- **A send holds until its receive is posted**: every op rendezvous over gloo, which completes a
  send only when the peer posted the receive.
- **Strict in-order pairing per communicator** (HCCL single send/recv; NCCL per communicator):
  every payload is preceded by an envelope ``[magic, seq, nbytes, dtype]``; the i-th receive on a
  communicator must meet the i-th send with the same size and dtype, else ``DeviceSemanticsError``
  (on hardware: a hang or silently corrupted activations). Envelopes go first, so a mismatch is
  caught before any payload moves.
- **Sticky asynchronous errors**: a failed task poisons its stream; ``event.query()`` of any later
  event on it raises (as a CUDA error or an aborted communicator does).
- **Group registries that merge identical options** (HCCL flavour): creating a group over the same
  ranks with the same ``hccl_config`` returns the earlier communicator, the worst case the notes
  warn about. Only distinct ``group_name``s give distinct communicators. Names over 32 characters
  are refused, as HCCL does. ``Options.hccl_config`` returns a copy, as the pybind property does:
  in-place edits are lost, the whole dict must be assigned.
- **Device count** (``SGLANG_VPP_DOUBLE_DEVICES``, default 8) lets tests show the
  one-rank-per-device refusal.

Fidelity limits: no real device memory or timing; batch calls are not checked for matching
structure across ranks (only per-op order); there is no watchdog that kills the process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from ..errors import CommError, DeviceSemanticsError
from ..gloo import classify_gloo_error

__all__ = ["DoubleDeviceApi", "DoubleStream", "DoubleEvent", "DoubleGroup", "DoubleHcclOptions",
           "DoubleNcclOptions", "HCCL_MAX_GROUP_NAME"]

HCCL_MAX_GROUP_NAME = 32
_MAGIC = 0x5650_5044  # "VPPD"
_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.bool, torch.complex64]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 255


class DoubleStream:
    """An in-order queue run by one daemon thread; the first failure sticks."""

    _names = itertools.count()

    def __init__(self, label: str = "") -> None:
        self.label = label or f"stream{next(self._names)}"
        self._cond = threading.Condition()
        self._tasks: deque[tuple[int, Callable[[], None]]] = deque()
        self._submitted = 0
        self._completed = 0
        self.error: BaseException | None = None
        self.error_ticket: int | None = None
        self._thread = threading.Thread(target=self._run, name=f"double-{self.label}", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> int:
        with self._cond:
            self._submitted += 1
            ticket = self._submitted
            self._tasks.append((ticket, task))
            self._cond.notify_all()
        return ticket

    def last_ticket(self) -> int:
        with self._cond:
            return self._submitted

    def reached(self, ticket: int) -> bool:
        """True once every task up to ``ticket`` ran; raises the sticky error if it hit them."""
        with self._cond:
            if self.error is not None and self.error_ticket is not None and self.error_ticket <= ticket:
                raise self.error
            return self._completed >= ticket

    def block_until(self, ticket: int, timeout_s: float | None = None) -> bool:
        """Wait until ``ticket`` ran (True) or ``timeout_s`` passed (False); raise a sticky error."""
        with self._cond:
            reached = self._cond.wait_for(lambda: self._completed >= ticket or
                                          (self.error_ticket is not None and self.error_ticket <= ticket), timeout_s)
            if self.error is not None and self.error_ticket is not None and self.error_ticket <= ticket:
                raise self.error
            return reached

    def wait_event(self, event: "DoubleEvent") -> None:
        """Later tasks on this stream wait until ``event`` fired (``torch.cuda.Stream.wait_event``)."""
        if event.stream is not None and event.stream is not self:
            source, ticket = event.stream, event.ticket
            self.submit(lambda: source.block_until(ticket))

    def synchronize(self) -> None:
        self.block_until(self.last_ticket())

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._tasks:
                    self._cond.wait()
                ticket, task = self._tasks.popleft()
                failed = self.error is not None
            if not failed:
                try:
                    task()
                except BaseException as error:  # becomes the stream's sticky error
                    with self._cond:
                        self.error, self.error_ticket = error, ticket
            with self._cond:
                self._completed = ticket
                self._cond.notify_all()


class DoubleEvent:
    """``torch.cuda.Event`` look-alike: fires when its stream passed the point it was recorded at."""

    def __init__(self, api: "DoubleDeviceApi") -> None:
        self._api = api
        self.stream: DoubleStream | None = None
        self.ticket = 0

    def record(self, stream: DoubleStream | None = None) -> None:
        self.stream = stream or self._api.current_stream()
        self.ticket = self.stream.last_ticket()

    def query(self) -> bool:
        return True if self.stream is None else self.stream.reached(self.ticket)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.block_until(self.ticket)

    def wait_for(self, timeout_s: float) -> bool:
        """Host wait with a timeout (what ``DeviceApi.wait_event`` offers for the double)."""
        return True if self.stream is None else self.stream.block_until(self.ticket, timeout_s)


class DoubleHcclOptions:
    """``ProcessGroupHCCL.Options`` look-alike. ``hccl_config`` reads return a copy (pybind)."""

    def __init__(self) -> None:
        self._hccl_config: dict[str, Any] = {}

    @property
    def hccl_config(self) -> dict[str, Any]:
        return dict(self._hccl_config)

    @hccl_config.setter
    def hccl_config(self, value: dict[str, Any]) -> None:
        self._hccl_config = dict(value)


@dataclass
class DoubleNcclOptions:
    """``ProcessGroupNCCL.Options`` look-alike."""

    is_high_priority_stream: bool = False


@dataclass
class DoubleGroup:
    """A device communicator of the double: a gloo group plus per-peer op counters."""

    gloo: Any
    ranks: tuple[int, ...]
    name: str
    options: Any
    sent: dict[int, int] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)
    aborted: bool = False
    #: How many ``new_group`` calls resolved to this communicator (> 1: merged).
    uses: int = 1


@dataclass
class DoubleP2POp:
    kind: str
    tensor: torch.Tensor
    peer: int
    group: DoubleGroup


class DoubleWork:
    """A device work: ``wait()`` makes the current stream wait; ``is_completed()`` does report."""

    def __init__(self, api: "DoubleDeviceApi", stream: DoubleStream, ticket: int) -> None:
        self._api, self._stream, self._ticket = api, stream, ticket

    def wait(self, timeout: timedelta | None = None) -> bool:
        current = self._api.current_stream()
        if current is not self._stream:
            stream, ticket = self._stream, self._ticket
            current.submit(lambda: stream.block_until(ticket))
        return True

    def is_completed(self) -> bool:
        return self._stream.reached(self._ticket)


class DoubleDeviceApi:
    """``DeviceApi`` on gloo with the device semantics above; ``flavour`` is "nccl" or "hccl"."""

    is_double = True
    device_type = "cpu"

    def __init__(self, flavour: str, device_count: int | None = None) -> None:
        if flavour not in ("nccl", "hccl"):
            raise ValueError(f"flavour must be 'nccl' or 'hccl', got {flavour!r}")
        self.flavour = flavour
        self._device_count = device_count
        self._local = threading.local()
        self._default_stream = DoubleStream("default")
        self._registry: dict[tuple[Any, ...], DoubleGroup] = {}
        self._lock = threading.Lock()
        self.device_index: int | None = None

    # ------------------------------------------------------------------ device
    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "device": f"gloo double of {self.flavour}"}

    def device_count(self) -> int:
        if self._device_count is not None:
            return self._device_count
        return int(os.environ.get("SGLANG_VPP_DOUBLE_DEVICES", "8"))

    def device_names(self) -> list[str]:
        return [f"double:{i} ({self.flavour} stand-in on gloo)" for i in range(self.device_count())]

    def set_device(self, index: int) -> torch.device:
        if not 0 <= index < self.device_count():
            raise DeviceSemanticsError(detail=f"device index {index} out of range 0..{self.device_count() - 1}")
        self.device_index = index
        return torch.device("cpu")

    def new_stream(self) -> DoubleStream:
        return DoubleStream()

    def new_event(self) -> DoubleEvent:
        return DoubleEvent(self)

    def current_stream(self) -> DoubleStream:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else self._default_stream

    @contextlib.contextmanager
    def stream(self, stream: DoubleStream) -> Iterator[DoubleStream]:
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(stream)
        try:
            yield stream
        finally:
            stack.pop()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        return None  # host memory: no caching allocator to inform

    def wait_event(self, event: DoubleEvent, timeout_s: float) -> bool:
        """Block until ``event`` fired or ``timeout_s`` passed; raises the stream's sticky error."""
        return event.wait_for(timeout_s)

    # ------------------------------------------------------------------ groups
    def make_pg_options(self) -> Any:
        return DoubleHcclOptions() if self.flavour == "hccl" else DoubleNcclOptions()

    def new_group(self, ranks: list[int], timeout: timedelta, pg_options: Any, group_desc: str) -> Any:
        gloo = dist.new_group(ranks, timeout=timeout, backend="gloo", group_desc=f"double_{group_desc}")
        key: tuple[Any, ...]
        if self.flavour == "hccl":
            if not isinstance(pg_options, DoubleHcclOptions):
                raise DeviceSemanticsError(
                    detail=f"hccl groups take ProcessGroupHCCL.Options, got {type(pg_options).__name__}")
            config = pg_options.hccl_config
            name = config.get("group_name")
            if name is not None and len(str(name)) > HCCL_MAX_GROUP_NAME:
                raise DeviceSemanticsError(
                    detail=(f"hccl_config group_name {name!r} has {len(str(name))} characters; "
                            f"HCCL allows {HCCL_MAX_GROUP_NAME}"))
            key = (tuple(ranks), json.dumps(config, sort_keys=True))
            comm_name = str(name) if name is not None else f"hccl_{'_'.join(map(str, ranks))}_default"
        else:
            key = (tuple(ranks), "nccl", id(gloo))  # NCCL never merges: a new group is a new communicator
            comm_name = f"ncclComm:{getattr(gloo, 'group_name', '?')}"
        if dist.get_rank() not in ranks:
            return DoubleGroup(gloo=None, ranks=tuple(ranks), name=comm_name, options=pg_options)
        with self._lock:
            existing = self._registry.get(key)
            if existing is None:
                group = DoubleGroup(gloo=gloo, ranks=tuple(ranks), name=comm_name, options=pg_options)
                self._registry[key] = group
                return group
            existing.uses += 1  # merged: the "new" group is the earlier communicator
        # Every member reaches this point for the same call. A member that destroys its duplicate
        # gloo group while another is still connecting that group's mesh ends the other's connect
        # with "Connection closed by peer": wait for all members first.
        dist.barrier(group=gloo)
        _destroy_quietly(gloo)
        return existing

    def communicator_name(self, group: DoubleGroup, rank: int) -> str:
        return group.name

    def abort_group(self, group: DoubleGroup) -> None:
        group.aborted = True

    def destroy_group(self, group: DoubleGroup) -> None:
        group.uses -= 1
        if group.uses <= 0 and group.gloo is not None:
            _destroy_quietly(group.gloo)
            group.gloo = None

    # ------------------------------------------------------------------ point to point
    def p2p_op(self, kind: str, tensor: torch.Tensor, peer: int, group: DoubleGroup) -> DoubleP2POp:
        if kind not in ("isend", "irecv"):
            raise ValueError(f"kind must be 'isend' or 'irecv', got {kind!r}")
        return DoubleP2POp(kind, tensor, peer, group)

    def isend(self, tensor: torch.Tensor, peer: int, group: DoubleGroup) -> DoubleWork:
        """A single (unbatched) send, for tests of the pairing rule."""
        return self.batch_isend_irecv([self.p2p_op("isend", tensor, peer, group)])[0]

    def irecv(self, tensor: torch.Tensor, peer: int, group: DoubleGroup) -> DoubleWork:
        return self.batch_isend_irecv([self.p2p_op("irecv", tensor, peer, group)])[0]

    def batch_isend_irecv(self, ops: list[DoubleP2POp]) -> list[DoubleWork]:
        if not ops:
            return []
        group = ops[0].group
        if any(op.group is not group for op in ops):
            raise DeviceSemanticsError(detail="batch_isend_irecv ops must all use one group (torch requires it)")
        if group.aborted or group.gloo is None:
            raise CommError(detail=f"{self.flavour} communicator {group.name} was aborted or destroyed")
        planned = []
        for op in ops:  # sequence numbers at issue time: issue order is the pairing order
            counters = group.sent if op.kind == "isend" else group.received
            seq = counters.get(op.peer, 0)
            counters[op.peer] = seq + 1
            planned.append((op, seq))
        stream = self.current_stream()
        ticket = stream.submit(lambda: self._run_batch(group, planned))
        return [DoubleWork(self, stream, ticket) for _ in ops]

    def _run_batch(self, group: DoubleGroup, planned: list[tuple[DoubleP2POp, int]]) -> None:
        if group.aborted:
            raise CommError(detail=f"{self.flavour} communicator {group.name} was aborted")
        envelopes = []
        for op, seq in planned:
            if op.kind == "isend":
                env = torch.tensor([_MAGIC, seq, op.tensor.numel() * op.tensor.element_size(),
                                    _dtype_code(op.tensor.dtype)], dtype=torch.int64)
            else:
                env = torch.zeros(4, dtype=torch.int64)
            envelopes.append(env)
        self._gloo_round(group, [(op, env) for (op, _), env in zip(planned, envelopes, strict=True)])
        for (op, seq), env in zip(planned, envelopes, strict=True):
            if op.kind != "irecv":
                continue
            magic, their_seq, nbytes, code = (int(v) for v in env.tolist())
            mine = op.tensor.numel() * op.tensor.element_size()
            if magic != _MAGIC or their_seq != seq or nbytes != mine or code != _dtype_code(op.tensor.dtype):
                raise DeviceSemanticsError(
                    rank=dist.get_rank(), peer=op.peer,
                    detail=(f"{self.flavour} communicator {group.name}: receive #{seq} posted for {mine} bytes of "
                            f"{op.tensor.dtype} met the peer's send #{their_seq} of {nbytes} bytes of "
                            f"{_DTYPES[code] if code < len(_DTYPES) else 'unknown'}; operations pair strictly "
                            "in issue order, so on hardware this hangs or corrupts data"),
                    fix="issue sends and receives on each communicator in the same order on both ranks")
        self._gloo_round(group, [(op, op.tensor) for op, _ in planned])

    def _gloo_round(self, group: DoubleGroup, items: list[tuple[DoubleP2POp, torch.Tensor]]) -> None:
        try:
            works = [(dist.isend if op.kind == "isend" else dist.irecv)(tensor, op.peer, group=group.gloo)
                     for op, tensor in items]
            for work in works:
                work.wait()  # bounded by the group's own timeout, like a device watchdog
        except RuntimeError as error:
            raise classify_gloo_error(error, None) from None


def _destroy_quietly(group: Any) -> None:
    try:
        dist.destroy_process_group(group)
    except Exception:  # already destroyed with the world
        pass
