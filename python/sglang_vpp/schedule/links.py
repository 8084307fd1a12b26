"""``Link``: one group on one pair of neighbouring ranks, an in-order rendezvous stream, as the engine times it.

A link's operations are the comm actions of the two ranks' streams that name this group and
peer, in stream order (given up front, or registered as a live run's streams grow), and the
i-th operation of one end pairs with the i-th of the other, as HCCL/NCCL pair point-to-point
calls. What the engine fills in is time: when each operation is posted, and from that when each
transfer starts (both ends posted and the previous transfer on this link done: one ordered
stream) and ends (start + transfer cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Action, ActionKind, link_key

__all__ = ["LinkOp", "Link"]


@dataclass(slots=True, eq=False)
class LinkOp:
    """One send or receive of one rank, as the engine tracks it."""

    rank: int
    step: int
    """Its index in the rank's stream; -1 for a send a fork carries from before it
    (``Planner.carried_sends``)."""
    action: Action
    index: int
    """Position among this rank's operations on the link (its pair index)."""
    post_time: float | None = None


@dataclass(slots=True, eq=False)
class Link:
    """See the module docstring. ``low``/``high`` are the two ranks."""

    group: str
    low: int
    high: int
    ops: dict[int, list[LinkOp]] = field(default_factory=dict)
    free_at: float = 0.0
    """When the transfer before this engine's first one ended (a fork's link: the planner's
    last reported arrival on it, ``Planner.link_free_at``)."""
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    """Start and end of transfer i, for the pairs resolved so far (a prefix, in order)."""

    @property
    def key(self) -> tuple[str, int, int]:
        return link_key(self.group, self.low, self.high)

    def pair(self, index: int) -> tuple[LinkOp, LinkOp] | None:
        """(send, recv) of pair ``index``, or None when the two heads do not match (a deadlock)."""
        a, b = self.ops[self.low][index], self.ops[self.high][index]
        if a.action.key != b.action.key or {a.action.kind, b.action.kind} != {ActionKind.SEND, ActionKind.RECV}:
            return None
        return (a, b) if a.action.kind is ActionKind.SEND else (b, a)

    def end_of(self, index: int) -> float | None:
        return self.ends[index] if index < len(self.ends) else None
