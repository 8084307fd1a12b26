"""``vpp-pack``: vpp-async plus cross-request pipelined packing.

When a request's last chunk has left stage 0, rank 0 faces a drain window: the remaining stages
of that chunk run elsewhere while rank 0 only has the fold-back work of the chunks in flight.
The planner estimates that window (``Planner._drain_budget``) and admits the next request's
leading chunks, cheapest first by construction (small prefix), beyond the in-flight limit while
their estimated stage-0 cost fits.
"""

from ..layout import LayoutKind
from .spec import CommSemantics, Policy, PolicySpec, Priority

SPEC = PolicySpec(
    name=Policy.VPP_PACK,
    layout_kind=LayoutKind.FOLDBACK,
    dynamic_chunks=False,
    comm_semantics=CommSemantics.ASYNC,
    num_groups=2,
    priority=Priority.FEED_PEER_FIRST,
    pack=True,
)
