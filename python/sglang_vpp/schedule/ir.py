"""The action IR: what one rank does, one small typed action at a time.

A schedule is, per rank, an ordered list of ``Action`` values. Three kinds:

- ``F`` (compute): run stage ``s`` on chunk ``(request, chunk)``. Text: ``3F1.0``.
- ``SEND_F``: send the output of stage ``s`` for ``(request, chunk)`` to ``peer`` on ``group``.
  Text: ``0SEND_F1.0>1@fwd``.
- ``RECV_F``: receive the output of stage ``s`` (the *producing* stage) from ``peer`` on ``group``.
  Text: ``1RECV_F1.0<0@fwd``.

Naming the producing stage on both ends makes a send and its receive carry the same key
``(stage, request, chunk)``, which is what the validator and the deadlock checker match on.

Groups: ``pp`` is the single pipeline group (cpp, dcpp and vanilla vpp). ``fwd`` carries rank
r -> r+1 traffic and ``bwd`` rank r+1 -> r traffic (vpp-async, vpp-pack). A communicator is a
group on one unordered pair of neighbouring ranks: two per pair, one per direction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from .errors import ParseError, ScheduleError

__all__ = [
    "ActionKind",
    "Action",
    "ChunkSpec",
    "RequestSpec",
    "GROUP_SINGLE",
    "GROUP_FORWARD",
    "GROUP_BACKWARD",
    "KNOWN_GROUPS",
    "compute",
    "send",
    "recv",
    "link_key",
    "transfer_span",
]

GROUP_SINGLE = "pp"
GROUP_FORWARD = "fwd"
GROUP_BACKWARD = "bwd"
KNOWN_GROUPS = (GROUP_SINGLE, GROUP_FORWARD, GROUP_BACKWARD)


class ActionKind(StrEnum):
    COMPUTE = "F"
    SEND = "SEND_F"
    RECV = "RECV_F"


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one rank. Hashable; ``str()`` gives the compact text form."""

    kind: ActionKind
    stage_index: int
    request_index: int
    chunk_index: int
    peer: int | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if min(self.stage_index, self.request_index, self.chunk_index) < 0:
            raise ScheduleError(f"negative index in action {self!r}")
        is_comm = self.kind is not ActionKind.COMPUTE
        if is_comm and (self.peer is None or self.group is None):
            raise ScheduleError(f"{self.kind} action needs a peer and a group: {self!r}")
        if not is_comm and (self.peer is not None or self.group is not None):
            raise ScheduleError(f"compute action takes no peer or group: {self!r}")
        if is_comm and self.group not in KNOWN_GROUPS:
            raise ScheduleError(f"unknown group {self.group!r}; expected one of {KNOWN_GROUPS}")

    @property
    def key(self) -> tuple[int, int, int]:
        """(stage, request, chunk): what a send and its matching receive share."""
        return (self.stage_index, self.request_index, self.chunk_index)

    @property
    def chunk_key(self) -> tuple[int, int]:
        return (self.request_index, self.chunk_index)

    @property
    def is_comm(self) -> bool:
        return self.kind is not ActionKind.COMPUTE

    def __str__(self) -> str:
        base = f"{self.stage_index}{self.kind}{self.request_index}.{self.chunk_index}"
        if self.kind is ActionKind.SEND:
            return f"{base}>{self.peer}@{self.group}"
        if self.kind is ActionKind.RECV:
            return f"{base}<{self.peer}@{self.group}"
        return base

    @staticmethod
    def parse(text: str) -> "Action":
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ParseError(
                f"cannot parse action {text!r}; expected e.g. '3F1.0', '0SEND_F1.0>1@fwd' "
                "or '1RECV_F1.0<0@fwd'"
            )
        kind = ActionKind(match["kind"])
        arrow, peer, group = match["arrow"], match["peer"], match["group"]
        expected_arrow = {ActionKind.SEND: ">", ActionKind.RECV: "<"}.get(kind)
        if arrow != expected_arrow:
            raise ParseError(f"action {text!r}: {kind} must be written with {expected_arrow!r}")
        return Action(
            kind,
            int(match["stage"]),
            int(match["request"]),
            int(match["chunk"]),
            int(peer) if peer is not None else None,
            group,
        )


_ACTION_RE = re.compile(
    r"(?P<stage>\d+)(?P<kind>SEND_F|RECV_F|F)(?P<request>\d+)\.(?P<chunk>\d+)"
    r"(?:(?P<arrow>[<>])(?P<peer>\d+)@(?P<group>[a-z]+))?"
)


def link_key(group: str, rank_a: int, rank_b: int) -> tuple[str, int, int]:
    """The communicator of a hand-off: one group on one pair of ranks, whichever way it goes. Its
    operations pair up in order on both ends (as NCCL/HCCL point-to-point calls do), so its
    transfers run one after another."""
    return (group, min(rank_a, rank_b), max(rank_a, rank_b))


def transfer_span(posted: float, previous_end: float, duration: float) -> tuple[float, float]:
    """(start, end) of a transfer whose two ends are both posted at ``posted``, on a communicator
    (``link_key``) whose previous transfer ends at ``previous_end``: one transfer at a time."""
    start = max(posted, previous_end)
    return start, start + duration


def compute(stage: int, request: int, chunk: int) -> Action:
    return Action(ActionKind.COMPUTE, stage, request, chunk)


def send(stage: int, request: int, chunk: int, peer: int, group: str) -> Action:
    return Action(ActionKind.SEND, stage, request, chunk, peer, group)


def recv(stage: int, request: int, chunk: int, peer: int, group: str) -> Action:
    return Action(ActionKind.RECV, stage, request, chunk, peer, group)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """A prompt to prefill: its length in tokens and when it arrives (seconds, planner clock)."""

    length: int
    arrival: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 1:
            raise ScheduleError(f"request length must be an integer >= 1 token, got {self.length!r}")
        if self.arrival < 0:
            raise ScheduleError(f"request arrival must be >= 0, got {self.arrival!r}")


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """Tokens ``[start, start + num_tokens)`` of request ``request_index``; ``start`` is the prefix.

    A micro-batch that carries several requests (short prompts batched into one forward, see
    ``Controller.joining_tokens``) is written as its first request's chunk (the *lead*, which names
    the micro-batch in actions) with the others' whole prompts in ``batch`` (the last may be a
    head: the first chunk of a prompt whose rest runs next). One forward runs ``total_tokens``
    tokens; each part attends over its own prefix only.
    """

    request_index: int
    chunk_index: int
    start: int
    num_tokens: int
    is_last: bool = False
    batch: tuple["ChunkSpec", ...] = ()
    """Other requests' chunks in the same forward: each the last chunk of its request, except that
    the final one may be a request's first chunk (a head: ``Controller.partial_fill``)."""

    def __post_init__(self) -> None:
        assert self.num_tokens >= 1 and self.start >= 0, self
        assert all(not part.batch for part in self.batch), self
        assert all(part.is_last for part in self.batch[:-1]), self
        assert not self.batch or self.batch[-1].is_last or self.batch[-1].start == 0, self

    @property
    def ends_request(self) -> bool:
        """Every request in the forward has its last chunk here (False: one continues)."""
        return self.is_last and all(part.is_last for part in self.batch)

    @property
    def completed_requests(self) -> tuple[int, ...]:
        """The requests whose last chunk the forward carries (a head's request completes later)."""
        return tuple(part.request_index for part in self.parts if part.is_last)

    @property
    def parts(self) -> tuple["ChunkSpec", ...]:
        """Every request's chunk in the forward, the lead first (the lead without ``batch``)."""
        if not self.batch:
            return (self,)
        return (ChunkSpec(self.request_index, self.chunk_index, self.start, self.num_tokens, self.is_last),
                *self.batch)

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole forward (the lead's plus the batched requests')."""
        return self.num_tokens + sum(part.num_tokens for part in self.batch)

    @property
    def key(self) -> tuple[int, int]:
        return (self.request_index, self.chunk_index)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens
