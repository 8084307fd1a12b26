"""``dcpp``: CPP with SGLang's dynamic chunking.

Later chunks shrink so that each costs about the same (``chunking.DynamicChunker``). Bubbles
shrink, but the work fragments into more, smaller chunks.
"""

from ..layout import LayoutKind
from .spec import CommSemantics, Policy, PolicySpec, Priority

SPEC = PolicySpec(
    name=Policy.DCPP,
    layout_kind=LayoutKind.CONTIGUOUS,
    dynamic_chunks=True,
    comm_semantics=CommSemantics.ASYNC,
    num_groups=1,
    priority=Priority.OLDEST_FIRST,
    request_barrier=False,
    pack=False,
)
