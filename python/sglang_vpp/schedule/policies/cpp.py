"""``cpp``: stock SGLang pipeline parallelism with chunked prefill.

Contiguous layout (rank r runs stage r), fixed chunks, one group, asynchronous sends (SGLang posts
sends and blocks only on receiving). Later chunks cost more under causal attention, so stages
fall out of step: imbalance bubbles.
"""

from ..layout import LayoutKind
from .spec import CommSemantics, Policy, PolicySpec, Priority

SPEC = PolicySpec(
    name=Policy.CPP,
    layout_kind=LayoutKind.CONTIGUOUS,
    dynamic_chunks=False,
    comm_semantics=CommSemantics.ASYNC,
    num_groups=1,
    priority=Priority.OLDEST_FIRST,
    request_barrier=False,
    pack=False,
)
