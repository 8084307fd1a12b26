"""The gloo backend (CPU, part of the core package), and the gloo wire used by every backend.

``GlooWire`` moves header frames and byte payloads over one 2-rank gloo group with deadlines.
``GlooLink`` is a whole link made of one wire (headers and tensors on the same group: per-pair
order keeps them in sequence). Device links (``device.py``) use a ``GlooWire`` for their headers
only, as SGLang sends tensor-dict metadata over its CPU group.

Measured gloo facts this relies on (docs/comm.md, section 3):
- a send completes only when the peer posts the receive, at every size: the channel thread, not
  the caller, waits for it;
- ``Work.wait(timeout)`` honours the timeout, and a timeout closes the whole gloo context ("Application
  timeout caused pair closure"); the peer then sees "Connection closed by peer". A dead peer is seen
  the same way, within milliseconds. ``classify_gloo_error`` turns these into our errors;
- ``new_group`` does not inherit the init timeout: every group gets ``timeout=`` explicitly.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .base import BackendStatus, CommBackend, Link, LinkSpec
from .errors import CommError, CommTimeoutError, PeerDeadError
from .message import (
    HEADER_FRAME_BYTES,
    MessageHeader,
    OutgoingMessage,
    decode_header,
    header_frames,
    overflow_size,
    parse_header_frame,
)

__all__ = ["GlooBackend", "GlooLink", "GlooWire", "classify_gloo_error", "new_gloo_group", "HEADER_TAG",
           "OVERFLOW_TAG", "PAYLOAD_TAG"]

_PEER_GONE = ("connection closed by peer", "connection reset", "broken pipe", "socket closed",
              "remote process exited", "econnreset", "epipe")
_TIMED_OUT = ("timed out", "timeout")


def classify_gloo_error(error: BaseException, timeout_s: float | None) -> CommError:
    """Map a transport ``RuntimeError`` to ``PeerDeadError`` / ``CommTimeoutError`` / ``CommError``."""
    # Our words only: the backend's text (e.g. gloo's "[...pair.cc:...] Connection closed by
    # peer [...]") stays on the exception chain as ``__cause__``, where a traceback shows it.
    lowered = str(error).lower()
    if "application timeout caused pair closure" in lowered:
        failure: CommError = CommTimeoutError(
            timeout_s=timeout_s,
            detail="this link was closed by an earlier timeout on this rank")
    elif any(marker in lowered for marker in _PEER_GONE):
        failure = PeerDeadError(
            detail="the peer process closed the link: it died (killed, crashed or exited) or gave up "
                   "after a failure of its own",
            fix="the launcher's log names the rank that died first and how")
    elif any(marker in lowered for marker in _TIMED_OUT):
        failure = CommTimeoutError(timeout_s=timeout_s, detail="the transport gave up waiting")
    else:
        failure = CommError(detail=f"unexpected transport failure ({type(error).__name__}, see the cause)")
    failure.__cause__ = error
    return failure


def new_gloo_group(spec: LinkSpec, timeout_s: float, role: str = "") -> Any:
    """A 2-rank gloo group with its own explicit timeout; collective over the whole world."""
    desc = f"vpp_{role}{spec.group}_{spec.ranks[0]}_{spec.ranks[1]}"
    return dist.new_group(list(spec.ranks), timeout=timedelta(seconds=timeout_s), backend="gloo",
                          group_desc=desc)


def gloo_group_id(group: Any) -> str:
    """Identity of a gloo group: torch's registered group name, unique per ``new_group`` call
    (gloo has no registry that could hand back an earlier group)."""
    return f"gloo:{getattr(group, 'group_name', '?')}"


HEADER_TAG = 1
OVERFLOW_TAG = 2
PAYLOAD_TAG = 0
MAX_PREPOSTED_HEADERS = 8


class GlooWire:
    """Headers and byte payloads over one 2-rank gloo group; every wait bounded by a deadline.

    Header frames, overflow frames and payloads use three gloo tags: gloo matches each tag in
    order on its own, so the receiver can post the fixed-size header frames of upcoming messages
    before it knows their payload sizes, and a pipelined sender's frames never land in a payload
    buffer. Measured here: 3x to 4x the message rate of posting one receive at a time."""

    def __init__(self, group: Any, peer: int, timeout_s: float) -> None:
        self.group = group
        self.peer = peer
        self.timeout_s = timeout_s
        self._preposted: deque[tuple[torch.Tensor, Any]] = deque()

    # -- primitives
    def _post(self, op: Any, tensor: torch.Tensor, tag: int) -> Any:
        try:
            return op(tensor, self.peer, group=self.group, tag=tag)
        except RuntimeError as error:  # a closed pair refuses at post time already
            raise classify_gloo_error(error, self.timeout_s) from None

    def wait(self, works: list[Any], deadline: float) -> None:
        for work in works:
            # At least 1 ms: a zero timeout would mean "no timeout" to some backends.
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                work.wait(timedelta(seconds=remaining))
            except RuntimeError as error:
                raise classify_gloo_error(error, self.timeout_s) from None

    def post_sends(self, tensors: list[torch.Tensor], tag: int = PAYLOAD_TAG) -> list[Any]:
        # gloo moves host memory only; device tensors are staged through the host.
        return [self._post(dist.isend, t if t.device.type == "cpu" else t.cpu(), tag) for t in tensors]

    def post_recvs(self, buffers: list[torch.Tensor], tag: int = PAYLOAD_TAG) -> list[Any]:
        return [self._post(dist.irecv, b, tag) for b in buffers]

    # -- headers
    def post_header_send(self, header: bytes) -> list[Any]:
        frames = header_frames(header)
        works = self.post_sends(frames[:1], HEADER_TAG)
        return works + self.post_sends(frames[1:], OVERFLOW_TAG)

    def recv_header(self, deadline: float, upcoming: int = 0) -> MessageHeader:
        """Receive the next header; pre-post the header frames of ``upcoming`` later receives."""
        while len(self._preposted) < 1 + min(upcoming, MAX_PREPOSTED_HEADERS):
            frame = torch.empty(HEADER_FRAME_BYTES, dtype=torch.uint8)
            self._preposted.append((frame, self.post_recvs([frame], HEADER_TAG)[0]))
        frame, work = self._preposted.popleft()
        self.wait([work], deadline)
        length, data = parse_header_frame(frame)
        extra = overflow_size(length)
        if extra:
            rest = torch.empty(extra, dtype=torch.uint8)
            self.wait(self.post_recvs([rest], OVERFLOW_TAG), deadline)
            data += rest.numpy().tobytes()
        return decode_header(data)


class GlooLink(Link):
    """A link whose headers and payloads both travel on one gloo group."""

    def __init__(self, spec: LinkSpec, rank: int, group: Any, timeout_s: float) -> None:
        self.spec = spec
        self.rank = rank
        self.group = group
        self.wire = GlooWire(group, spec.peer_of(rank), timeout_s)

    def communicator_id(self) -> str:
        return gloo_group_id(self.group)

    def post_send(self, message: OutgoingMessage) -> Any:
        # The message's tensors travel by reference: keep them referenced until finish_send.
        return self.wire.post_header_send(message.header) + self.wire.post_sends(message.payloads), message

    def finish_send(self, token: Any, deadline: float) -> None:
        works, _message = token
        self.wire.wait(works, deadline)

    def recv(self, deadline: float, upcoming: int = 0) -> tuple[MessageHeader, dict[str, Any]]:
        header = self.wire.recv_header(deadline, upcoming)
        buffers = header.allocate("cpu")
        self.wire.wait(self.wire.post_recvs(buffers), deadline)
        return header, header.assemble(buffers)

    def exchange(self, message: OutgoingMessage, deadline: float) -> tuple[MessageHeader, dict[str, Any]]:
        # Post our whole message before receiving: both ends do the same, so neither waits first.
        token = self.post_send(message)
        header, tensors = self.recv(deadline)
        self.finish_send(token, deadline)
        return header, tensors

    def close(self) -> None:
        _destroy(self.group)


def _destroy(group: Any) -> None:
    try:
        dist.destroy_process_group(group)
    except Exception:  # already destroyed with the world, or torch refused: nothing left to free
        pass


class GlooBackend(CommBackend):
    """CPU point-to-point over gloo; the backend CI runs on."""

    name = "gloo"
    distribution = "sglang-vpp"

    def __init__(self, **options: Any) -> None:
        if options:
            from .errors import CommConfigError

            raise CommConfigError(f"the gloo backend takes no options, got {sorted(options)}. "
                                  "Fix: drop backend_options for gloo.")

    @classmethod
    def probe(cls) -> BackendStatus:
        versions = {"torch": torch.__version__}
        if not dist.is_available() or not dist.is_gloo_available():
            return BackendStatus(cls.name, False, reason=f"torch {torch.__version__} was built without gloo",
                                 fix="install a torch build with distributed support",
                                 distribution=cls.distribution, versions=versions)
        return BackendStatus(cls.name, True, distribution=cls.distribution, versions=versions, devices=("cpu",))

    def open_link(self, spec: LinkSpec, rank: int, timeout_s: float) -> Link | None:
        group = new_gloo_group(spec, timeout_s)
        if rank not in spec.ranks:
            return None
        return GlooLink(spec, rank, group, timeout_s)
