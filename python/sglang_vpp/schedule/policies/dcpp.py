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

SMOOTH_FACTOR = 1.0
"""Smoothing of the curve's chunk toward the base size (``DynamicChunker.smooth_factor``): the
paper's DCPP baseline uses 1.0 (no smoothing); SGLang's server default is 0.75
(``SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR``), which a dcpp server keeps unless that is set."""
