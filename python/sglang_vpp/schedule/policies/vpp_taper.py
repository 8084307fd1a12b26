"""``vpp-taper``: vpp-pack with chunk sizes planned for the pipeline depth.

With fixed chunks a fold-back pipeline of 2P stages loses its lead as P grows: a 512K prompt in
64K chunks is 8 chunks for 16 stages at P = 8, so the pipeline never fills, and the last chunk,
the costliest (longest prefix), crosses every stage alone while the others drain. This mode
keeps everything of vpp-pack (fold-back layout, two groups, async sends, feed-peer-first,
packing) and changes only how a request is cut (``chunking.TaperedChunker``):

- the chunk size is a cap: a request gets at least ``CHUNKS_PER_STAGE`` x 2P chunks (never
  below ``MIN_BODY_TOKENS`` each), so the fold-back pairing reaches its steady state;
- the first chunks ramp up from a quarter of the body size (short fill), and the last chunks
  halve what remains down to a quarter (short drain).

Chosen on the DeepSeek-V3.1 512K sweep of docs/simulator.md (P = 2, 4, 8; chunk 8K to 64K).
"""

import dataclasses

from . import vpp_pack
from .spec import Policy

CHUNKS_PER_STAGE = 4
"""Chunks per virtual stage a request is cut into at least (2P stages): fewer leave the pipeline
mostly in fill and drain; more cost per-chunk overheads (collective latency, launches)."""
TAPER_RATIO = 4
"""The ramps start and end at the body size over this (about log2 of it extra chunks per end)."""
MIN_BODY_TOKENS = 2048
"""Never cut below this many tokens per body chunk: kernels lose efficiency on small chunks
(half efficiency at a few hundred to a few thousand tokens, docs/calibration.md)."""

SPEC = dataclasses.replace(vpp_pack.SPEC, name=Policy.VPP_TAPER, tapered_chunks=True)
