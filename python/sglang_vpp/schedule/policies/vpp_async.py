"""``vpp-async``: VPP with communication off the critical path.

Two groups, one per direction (``fwd``: r -> r+1, ``bwd``: r+1 -> r), so the forward sweep and the
fold-back never share an ordered communicator: each communicator carries one direction only and
its sends and receives pair up in chunk order. Sends are posted asynchronously. Locally a rank
runs first the ready stage whose output another rank waits for (on rank 0: s0/C_{k+1} before
s3/C_{k-1}, the method's swap), so the transfer starts while the peer is still computing.
"""

from ..layout import LayoutKind
from .spec import CommSemantics, Policy, PolicySpec, Priority

SPEC = PolicySpec(
    name=Policy.VPP_ASYNC,
    layout_kind=LayoutKind.FOLDBACK,
    dynamic_chunks=False,
    comm_semantics=CommSemantics.ASYNC,
    num_groups=2,
    priority=Priority.FEED_PEER_FIRST,
    request_barrier=True,
    pack=False,
)
