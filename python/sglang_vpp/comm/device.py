"""Device links, shared by the NCCL and HCCL backends (both mirror the CUDA stream API).

A ``DeviceLink`` is one direction's communicator on a neighbour pair, made of:

- a **device group** (NCCL or HCCL, created by the backend with its own options) that carries the
  tensor payloads, always through ``batch_isend_irecv``: HCCL needs a send and its receive in one
  ``HcclBatchSendRecv`` call when both directions meet, NCCL groups the calls likewise; one batch
  per message keeps the strict in-order pairing trivially true;
- a **gloo group** on the same pair for the header frames (host metadata, as SGLang sends
  tensor-dict metadata over its CPU group): the receiver learns shapes without a device sync and
  allocates before posting its device receives;
- its own **stream**: copies and transfers of this direction queue there, so the forward sweep,
  the fold-back and the compute stream overlap.

Data flow of a send: caller thread ``on_submit`` records an event on the producer's current
stream -> channel thread: header frames over gloo -> on the link stream: wait for that event,
stage host tensors to the device, ``batch_isend_irecv`` the payloads, ``work.wait()`` (stream-side),
record a done event -> poll ``event.query()`` until it fires or the deadline passes.
[Note: device readiness by event polling] ``event.synchronize()`` cannot time out and an NCCL/HCCL
hang would hold the thread forever; ``query()`` with a short back-off (20 to 200 us) costs little
and lets the deadline abort the communicator and raise ``CommTimeoutError`` naming the operation.
An API that offers ``wait_event(event, timeout_s)`` (the device double) is waited on instead.
"""

from __future__ import annotations

import os
import time
from abc import abstractmethod
from datetime import timedelta
from typing import Any, ClassVar

import torch

from .base import BackendStatus, CommBackend, Link, LinkSpec
from .config import CommConfig
from .device_api import DeviceApi
from .errors import BackendUnavailableError, CommError, CommTimeoutError, PeerDeadError
from .gloo import GlooWire, new_gloo_group
from .message import MessageHeader, OutgoingMessage

__all__ = ["DeviceBackend", "DeviceLink"]

_POLL_START_S = 20e-6
_POLL_MAX_S = 200e-6  # worst added latency per transfer; a thread waking every 200 us costs little


class DeviceLink(Link):
    """One communicator on a device: payloads on the device group, headers on a gloo group."""

    def __init__(self, spec: LinkSpec, rank: int, *, backend: "DeviceBackend", data_group: Any,
                 meta_group: Any, timeout_s: float) -> None:
        self.spec = spec
        self.rank = rank
        self.backend = backend
        self.api: DeviceApi = backend.api
        self.device: torch.device = backend.device
        self.data_group = data_group
        self.meta_group = meta_group
        self.timeout_s = timeout_s
        self.wire = GlooWire(meta_group, spec.peer_of(rank), timeout_s)
        self.stream = self.api.new_stream()

    def communicator_id(self) -> str:
        return self.backend.communicator_id(self.data_group, self.rank)

    def on_submit(self, message: OutgoingMessage) -> None:
        if message.payloads:
            event = self.api.new_event()
            event.record(self.api.current_stream())
            message.ready_event = event

    def deliver(self, tensors: dict[str, Any]) -> dict[str, Any]:
        # Received buffers were allocated on the link stream; the consumer uses them on its own
        # stream, so the caching allocator must not hand their memory back to the link stream early.
        consumer = self.api.current_stream()
        for value in tensors.values():
            if isinstance(value, torch.Tensor) and value.numel():
                self.api.record_stream(value, consumer)
        return tensors

    def post_send(self, message: OutgoingMessage) -> Any:
        header_works = self.wire.post_header_send(message.header)
        transfer = None
        if message.payloads:
            transfer = self._start_transfer(message.payloads, [], message.ready_event)
        return header_works, transfer

    def finish_send(self, token: Any, deadline: float) -> None:
        header_works, transfer = token
        if transfer is not None:
            self._finish_transfer(transfer, deadline, "send")
        self.wire.wait(header_works, deadline)

    def recv(self, deadline: float, upcoming: int = 0) -> tuple[MessageHeader, dict[str, Any]]:
        header = self.wire.recv_header(deadline, upcoming)
        buffers = self._allocate(header)
        if buffers:
            self._finish_transfer(self._start_transfer([], buffers, None), deadline, "recv")
        return header, header.assemble(buffers, self.device)

    def exchange(self, message: OutgoingMessage, deadline: float) -> tuple[MessageHeader, dict[str, Any]]:
        header_works = self.wire.post_header_send(message.header)
        header = self.wire.recv_header(deadline)
        buffers = self._allocate(header)
        if message.payloads or buffers:
            # One batch with both directions: the pairing HCCL's HcclBatchSendRecv needs.
            transfer = self._start_transfer(message.payloads, buffers, message.ready_event)
            self._finish_transfer(transfer, deadline, "exchange")
        self.wire.wait(header_works, deadline)
        return header, header.assemble(buffers, self.device)

    def close(self) -> None:
        self.api.destroy_group(self.data_group)
        try:
            import torch.distributed as dist

            dist.destroy_process_group(self.meta_group)
        except Exception:  # already gone with the world group
            pass

    # ------------------------------------------------------------------ internals
    def _allocate(self, header: MessageHeader) -> list[torch.Tensor]:
        with self.api.stream(self.stream):
            return header.allocate(self.device)

    def _start_transfer(self, sends: list[torch.Tensor], recvs: list[torch.Tensor], ready_event: Any) -> Any:
        """Queue one batch on the link stream; return (done event, tensors to keep alive, counts)."""
        peer = self.spec.peer_of(self.rank)
        with self.api.stream(self.stream):
            if ready_event is not None:
                self.stream.wait_event(ready_event)
            staged = [t if t.device == self.device else t.to(self.device, non_blocking=True) for t in sends]
            ops = [self.api.p2p_op("isend", t, peer, self.data_group) for t in staged]
            ops += [self.api.p2p_op("irecv", t, peer, self.data_group) for t in recvs]
            try:
                works = self.api.batch_isend_irecv(ops)
                for work in works:
                    work.wait()  # stream-side wait: the link stream now follows the transfers
            except CommError:
                raise
            except RuntimeError as error:
                raise self._classify(error) from None
            done = self.api.new_event()
            done.record(self.stream)
        return done, (staged, recvs), (len(sends), len(recvs))

    def _finish_transfer(self, transfer: Any, deadline: float, what: str) -> None:
        done, _keep_alive, (num_sends, num_recvs) = transfer
        self._poll(done, deadline, what, num_sends, num_recvs)

    def _poll(self, event: Any, deadline: float, what: str, num_sends: int, num_recvs: int) -> None:
        pause = _POLL_START_S
        wait_event = getattr(self.api, "wait_event", None)
        while True:
            try:
                if wait_event is not None:
                    if wait_event(event, max(0.0, deadline - time.monotonic())):
                        return
                elif event.query():
                    return
            except CommError:
                raise
            except RuntimeError as error:
                raise self._classify(error) from None
            if time.monotonic() >= deadline:
                self.api.abort_group(self.data_group)
                raise CommTimeoutError(
                    timeout_s=self.timeout_s,
                    detail=(f"device {what} of {num_sends} send / {num_recvs} receive payload(s) on "
                            f"{self.backend.name} communicator {self.spec} did not complete; the peer did not "
                            "post the matching operation (per communicator, operations pair in issue order). "
                            "The communicator was aborted"))
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def _classify(self, error: RuntimeError) -> CommError:
        return self.backend.classify_error(error, self.timeout_s)


class DeviceBackend(CommBackend):
    """Base of the NCCL and HCCL backends: device choice, link creation, error mapping.

    Subclasses provide ``_load_api`` (the real device API, imported lazily), ``pg_options`` (the
    device group's creation options for one ``LinkSpec``) and the wording of their errors."""

    device_word: ClassVar[str] = "device"

    def __init__(self, api: DeviceApi | None = None) -> None:
        self._api = api
        self.device: torch.device = torch.device("cpu")

    @property
    def api(self) -> DeviceApi:
        if self._api is None:
            self._api = self._load_api()
        return self._api

    @property
    def is_double(self) -> bool:
        return bool(getattr(self.api, "is_double", False))

    def describe(self) -> str:
        return f"{self.name}@double" if self._api is not None and self.is_double else self.name

    @abstractmethod
    def _load_api(self) -> DeviceApi:
        """The real device API; raise ``BackendUnavailableError`` saying why it cannot load."""

    @abstractmethod
    def pg_options(self, spec: LinkSpec) -> Any:
        """Creation options of the device group for ``spec``."""

    def communicator_id(self, group: Any, rank: int) -> str:
        """Identity of the device communicator behind ``group`` (NCCL: group name, uid and comm
        pointer; HCCL: ``get_hccl_comm_name``)."""
        return self.api.communicator_name(group, rank)

    #: Lower-case fragments of the device library's messages for a vanished peer / a timeout.
    peer_gone_markers: ClassVar[tuple[str, ...]] = ()
    timeout_markers: ClassVar[tuple[str, ...]] = ("timeout", "timed out")

    def classify_error(self, error: RuntimeError, timeout_s: float) -> CommError:
        """Map a device runtime error to ``PeerDeadError`` / ``CommTimeoutError`` / ``CommError``."""
        # Our words only; the library's own text stays on the chain as ``__cause__``.
        lowered = str(error).lower()
        if any(marker in lowered for marker in self.peer_gone_markers):
            failure: CommError = PeerDeadError(
                detail=f"the peer process left the {self.name} communicator (it died or gave up)",
                fix="the launcher's log names the rank that died first and how")
        elif any(marker in lowered for marker in self.timeout_markers):
            failure = CommTimeoutError(timeout_s=timeout_s, detail=f"{self.name} gave up waiting")
        else:
            failure = CommError(detail=f"unexpected {self.name} failure (see the cause)")
        failure.__cause__ = error
        return failure

    @classmethod
    def probe(cls) -> BackendStatus:  # pragma: no cover - overridden by every concrete backend
        return BackendStatus(cls.name, False, reason="abstract device backend")

    def prepare(self, rank: int, world_size: int, config: CommConfig) -> None:
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        count = self.api.device_count()
        if count < local_world:
            raise BackendUnavailableError(
                backend=self.describe(), rank=rank,
                detail=(f"{local_world} ranks on this host but only {count} {self.device_word}(s): "
                        f"{self.name} refuses two ranks on one {self.device_word}"),
                fix=f"run at most {count} ranks per host (one per {self.device_word}), or use the gloo backend")
        self.device = self.api.set_device(local_rank)

    def open_link(self, spec: LinkSpec, rank: int, timeout_s: float) -> Link | None:
        # Both groups on every rank, in the same order: new_group is collective over the world.
        meta_group = new_gloo_group(spec, timeout_s, role="meta_")
        data_group = self.api.new_group(list(spec.ranks), timedelta(seconds=timeout_s), self.pg_options(spec),
                                        f"vpp_{spec.group}_{spec.ranks[0]}_{spec.ranks[1]}")
        if rank not in spec.ranks:
            return None
        return DeviceLink(spec, rank, backend=self, data_group=data_group, meta_group=meta_group,
                          timeout_s=timeout_s)
