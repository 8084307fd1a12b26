"""``PolicySpec``: the handful of decisions that make one policy differ from another."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..layout import LayoutKind

__all__ = ["Policy", "CommSemantics", "Priority", "PolicySpec"]


class Policy(StrEnum):
    CPP = "cpp"
    DCPP = "dcpp"
    VPP = "vpp"
    VPP_ASYNC = "vpp-async"
    VPP_PACK = "vpp-pack"
    VPP_TAPER = "vpp-taper"
    VPP_STREAM = "vpp-stream"


class CommSemantics(StrEnum):
    BLOCKING = "blocking"  # a send holds its rank until the peer receives (rendezvous)
    ASYNC = "async"  # a send is posted and the rank goes on; receives still wait


class Priority(StrEnum):
    """Which ready stage a rank runs first when it holds more than one."""

    OLDEST_FIRST = "oldest-first"  # drain: the earliest chunk (fold-back stage) first
    FEED_PEER_FIRST = "feed-peer-first"  # a stage whose output goes to another rank first, so
    # the transfer overlaps this rank's next compute; among those, the oldest chunk
    FEED_PEER_UNTIL_FULL = "feed-peer-until-full"  # feed-peer-first, except that the rank of
    # stage 0 finishes the oldest micro-batch first once the V is full (``Controller.pick``)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: Policy
    layout_kind: LayoutKind
    """Contiguous (one stage per rank) or fold-back (two virtual stages per rank)."""
    dynamic_chunks: bool
    """DCPP's latency-balanced chunk sizes instead of fixed ones."""
    comm_semantics: CommSemantics
    num_groups: int
    """1: one group for both directions; 2: one group per direction."""
    priority: Priority
    request_barrier: bool
    """The next request enters stage 0 only after the previous one left the last stage (one V
    per request, as in the method's Algorithm 1); without it chunks stream across requests."""
    pack: bool
    """Relax the barrier: start the next chunks inside the predicted drain window while they fit."""
    tapered_chunks: bool = False
    """Chunk with ``chunking.TaperedChunker`` (enough chunks per request for the pipeline depth,
    ramped at both ends) instead of fixed chunks; see ``policies/vpp_taper.py``."""
    deep_window: bool = False
    """Admit up to twice the layout's in-flight limit (2(2P-1) for fold-back: the micro-batch
    slots SGLang already reserves for packing) so that micro-batches of unequal cost queue in
    front of a slow stage instead of leaving the others idle; only while the ones in flight
    differ in cost (``Controller.deep_window_open``); see ``policies/vpp_stream.py``."""
