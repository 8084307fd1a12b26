"""``vpp``: the paper's vanilla VPP.

Fold-back layout with fixed chunks; hand-offs are blocking and in order on one group. A rank
that holds two stages drains first (the older chunk's fold-back stage before the next chunk's
forward stage). When two neighbours both hold a finished output for each other, the fold-back
(higher stage) transfer goes first and the other rank posts its receive before its own send:
the pairing the planner emits is one both ranks can follow, so it cannot deadlock, but the
transfers sit on the critical path (exposed communication).
"""

from ..layout import LayoutKind
from .spec import CommSemantics, Policy, PolicySpec, Priority

SPEC = PolicySpec(
    name=Policy.VPP,
    layout_kind=LayoutKind.FOLDBACK,
    dynamic_chunks=False,
    comm_semantics=CommSemantics.BLOCKING,
    num_groups=1,
    priority=Priority.OLDEST_FIRST,
    request_barrier=True,
    pack=False,
)
