"""The communication abstraction: what the runtime sees, and what a backend implements.

Three layers, from the runtime down:

- ``PipelineCommunicator`` (one per rank): non-blocking ``isend`` / ``irecv`` / ``exchange`` of
  tensor dicts to a neighbour on a named group, returning ``CommHandle``s; ``wait_any`` as the
  readiness primitive; ``close``. ``communicator.Communicator`` is the one implementation, shared
  by every backend.
- ``Link`` (one per group and rank pair, seen from one member): moves one encoded message
  (``message.OutgoingMessage``) at a time. The communicator runs each link's operations on that
  link's own thread in issue order (``channel.Channel``), which gives every backend the device
  semantics: per communicator, operations pair in issue order, and a send can hold its queue
  until the peer posts the receive.
- ``CommBackend`` (one per backend name, found through the ``sglang_vpp.comm_backends`` entry
  points): probes availability without side effects and opens links.

Data flow of one send: caller thread ``isend(dict)`` -> ``encode_message`` (validation errors are
raised here, synchronously) -> channel queue -> channel thread ``Link.send(message, deadline)`` ->
handle completes (``is_ready()`` turns True, ``wait_any`` wakes). A receive mirrors it:
``Link.recv`` returns the header and the rebuilt dict; the channel checks the sequence number.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

from .config import CommConfig
from .message import MessageHeader, OutgoingMessage

__all__ = [
    "OpKind",
    "LinkSpec",
    "BackendStatus",
    "CommHandle",
    "Link",
    "CommBackend",
    "PipelineCommunicator",
    "TensorDict",
]

#: What travels: str -> tensor, or str -> JSON metadata (see ``message``).
TensorDict = Mapping[str, Any]


class OpKind(StrEnum):
    SEND = "send"
    RECV = "recv"
    EXCHANGE = "exchange"


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """One communicator: group ``group`` on the rank pair ``ranks`` (low, high)."""

    group: str
    ranks: tuple[int, int]

    def __post_init__(self) -> None:
        assert self.ranks[0] < self.ranks[1], self.ranks

    def peer_of(self, rank: int) -> int:
        assert rank in self.ranks, (rank, self.ranks)
        return self.ranks[1] if rank == self.ranks[0] else self.ranks[0]

    def __str__(self) -> str:
        return f"{self.group}[{self.ranks[0]}-{self.ranks[1]}]"


@dataclass(frozen=True)
class BackendStatus:
    """What ``probe()`` found, without creating any process group."""

    name: str
    available: bool
    reason: str = ""
    """Why it is unavailable (empty when available)."""
    fix: str = ""
    """What to install or change to make it available."""
    distribution: str | None = None
    """The Python distribution that provides the backend."""
    version: str | None = None
    """That distribution's installed version, when installed."""
    versions: Mapping[str, str] = field(default_factory=dict)
    """Versions of what the backend runs on (torch, NCCL, torch_npu, CANN)."""
    devices: tuple[str, ...] = ()
    """Devices the backend can use, e.g. ``("cuda:0 NVIDIA H200", ...)``."""


class CommHandle(ABC):
    """One pending operation. Completion is pushed by the channel thread, never polled from the
    transport (gloo's ``Work.is_completed()`` stays False until someone calls ``wait()``)."""

    kind: OpKind
    action: str
    group: str
    peer: int
    rank: int

    @abstractmethod
    def is_ready(self) -> bool:
        """True once the operation finished, successfully or not. Never blocks."""

    @abstractmethod
    def wait(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """Block until done; return the received dict (recv, exchange) or None (send).

        Raises the operation's ``CommError``, or ``CommTimeoutError`` if it is still pending after
        ``timeout_s`` (default: the communicator's ``timeout_s``). A timed-out wait does not cancel
        the operation: it can be waited for again until the transport gives up."""

    @abstractmethod
    def exception(self) -> BaseException | None:
        """The failure if the operation finished with one; None if pending or successful."""

    @abstractmethod
    def add_done_callback(self, fn: Callable[["CommHandle"], None]) -> None:
        """Call ``fn(handle)`` when done (immediately if already done). Runs on the channel thread:
        keep it short and never block in it."""


class Link(ABC):
    """One communicator seen from one member rank. Its methods run on the link's channel thread,
    one at a time, in issue order; they must return or raise by ``deadline`` (``time.monotonic()``),
    raising ``CommTimeoutError`` / ``PeerDeadError`` / ``CommError`` with a ``detail``. The channel
    adds rank, peer, group and action."""

    spec: LinkSpec
    rank: int

    @property
    def peer(self) -> int:
        return self.spec.peer_of(self.rank)

    @abstractmethod
    def communicator_id(self) -> str:
        """Identity of the underlying communicator: two links with the same id share one."""

    def on_submit(self, message: OutgoingMessage) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called in the caller's thread when a send is issued (device links record a stream event)."""

    def deliver(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Called in the waiting thread before a received dict is handed over (device links mark
        the tensors as used on the consumer's stream)."""
        return tensors

    @abstractmethod
    def post_send(self, message: OutgoingMessage) -> Any:
        """Start sending one message; return a token for ``finish_send``. Must not wait for the
        peer: the channel posts a run of consecutive sends before finishing the first, so they
        pipeline (they still pair in issue order)."""

    @abstractmethod
    def finish_send(self, token: Any, deadline: float) -> None:
        """Wait until the send started by ``post_send`` completed."""

    def send(self, message: OutgoingMessage, deadline: float) -> None:
        """Send one message to the peer."""
        self.finish_send(self.post_send(message), deadline)

    @abstractmethod
    def recv(self, deadline: float, upcoming: int = 0) -> tuple[MessageHeader, dict[str, Any]]:
        """Receive one message from the peer. ``upcoming``: how many receives directly follow this
        one in the queue; a link may pre-post their headers (never past a queued send, which would
        let the peer's send pair before ours)."""

    @abstractmethod
    def exchange(self, message: OutgoingMessage, deadline: float) -> tuple[MessageHeader, dict[str, Any]]:
        """Send one message and receive one, posted together (one batched call where the device
        needs it), so that both ranks exchanging on one communicator cannot block each other."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the groups. Called once, after the channel thread stopped."""


class CommBackend(ABC):
    """A communication backend, registered under ``sglang_vpp.comm_backends``.

    Lifecycle on each rank: ``prepare`` (pick the device), then ``open_link`` for every
    ``LinkSpec`` in the same order on every rank (``torch.distributed.new_group`` is collective over
    the whole world, members or not), then the links are used and closed."""

    name: ClassVar[str]
    distribution: ClassVar[str]

    @classmethod
    @abstractmethod
    def probe(cls) -> BackendStatus:
        """Availability, versions and devices. Never raises, creates no group, imports lazily."""

    def prepare(self, rank: int, world_size: int, config: CommConfig) -> None:  # noqa: B027 - optional hook
        """Check that this backend can run this rank here (raise ``BackendUnavailableError``)."""

    @abstractmethod
    def open_link(self, spec: LinkSpec, rank: int, timeout_s: float) -> Link | None:
        """Create the group(s) of ``spec``; return the link on members, None elsewhere."""

    def describe(self) -> str:
        return self.name


class PipelineCommunicator(ABC):
    """The pipeline communicator of one rank: what the runtime uses.

    ``group`` is a name from ``CommConfig.group_names`` (``fwd``/``bwd`` or ``pp``); ``dst`` /
    ``src`` / ``peer`` are global ranks that share a link with this rank (neighbours by default).
    ``action`` labels the operation in errors; pass the schedule's ``str(action)``.
    Tensors given to ``isend`` must not be modified until its handle is done."""

    rank: int
    world_size: int
    backend_name: str
    group_names: tuple[str, ...]

    @abstractmethod
    def isend(self, tensors: TensorDict, dst: int, group: str, *, action: str | None = None) -> CommHandle:
        """Post a send and return at once."""

    @abstractmethod
    def irecv(self, src: int, group: str, *, action: str | None = None) -> CommHandle:
        """Post a receive and return at once; ``handle.wait()`` returns the dict."""

    @abstractmethod
    def exchange(self, tensors: TensorDict, peer: int, group: str, *, action: str | None = None) -> CommHandle:
        """Send to and receive from ``peer`` as one batched operation; the peer must call
        ``exchange`` at the same point of its stream on this group."""

    def send(self, tensors: TensorDict, dst: int, group: str, *, action: str | None = None,
             timeout_s: float | None = None) -> None:
        """Blocking send: ``isend(...).wait(timeout_s)``."""
        self.isend(tensors, dst, group, action=action).wait(timeout_s)

    def recv(self, src: int, group: str, *, action: str | None = None,
             timeout_s: float | None = None) -> dict[str, Any]:
        """Blocking receive: ``irecv(...).wait(timeout_s)``."""
        result = self.irecv(src, group, action=action).wait(timeout_s)
        assert result is not None
        return result

    @abstractmethod
    def wait_any(self, handles: Sequence[CommHandle], timeout_s: float | None = None) -> list[CommHandle]:
        """Block until at least one of ``handles`` is ready; return the ready ones (in the given
        order). Raises ``CommTimeoutError`` if none is ready within ``timeout_s``."""

    def wait_all(self, handles: Iterable[CommHandle], timeout_s: float | None = None) -> list[Any]:
        """Wait for each handle in turn; return their results. The timeout applies per handle."""
        return [handle.wait(timeout_s) for handle in handles]

    @abstractmethod
    def communicator_ids(self) -> dict[tuple[str, int], str]:
        """``(group, peer) -> communicator id`` of every link of this rank."""

    @abstractmethod
    def close(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop the channel threads and release the groups. ``drain``: first let queued operations
        finish (up to ``timeout_s``). Pending operations then fail with ``CommClosedError``.
        Never raises and never waits past ``timeout_s`` plus a short grace."""

    def __enter__(self) -> "PipelineCommunicator":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        # On an exception, do not drain: the peer is probably not going to pair our operations.
        self.close(drain=exc_info[0] is None)
