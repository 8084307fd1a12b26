"""``vpp-taper``: vpp-pack with chunk sizes planned for the pipeline depth.

With fixed chunks a fold-back pipeline of 2P stages loses its lead as P grows: a 512K prompt in
64K chunks is 8 chunks for 16 stages at P = 8, so the pipeline never fills, and the last chunk,
the costliest (longest prefix), crosses every stage alone while the others drain. This mode
keeps everything of vpp-pack (fold-back layout, two groups, async sends, feed-peer-first,
packing) and changes only how a request is cut (``chunking.TaperedChunker``):

- the chunk size is a cap: a request gets at least ``CHUNKS_PER_STAGE`` x 2P chunks (never
  below ``MIN_BODY_TOKENS`` each), so the fold-back pairing reaches its steady state;
- the first chunk is half the body size (shorter fill), and the last chunks halve what remains
  down to half the body size (shorter drain).

The three constants were chosen on the DeepSeek-V3.1 512K sweep of docs/simulator.md (P = 2, 4,
8; chunk 8K to 64K; ratios 2-8 and 2-4 chunks per stage tried): a planning rule tuned on one
model and one cost model, not a derived optimum.
"""

import dataclasses

from . import vpp_pack
from .spec import Policy

CHUNKS_PER_STAGE = 3
"""Chunks per virtual stage a request is cut into at least (2P stages): fewer leave the pipeline
mostly in fill and drain; more cost per-chunk overheads (collective latency, launches)."""
TAPER_RATIO = 2
"""The ramps start and end at the body size over this (about log2 of it extra chunks per end)."""
MIN_BODY_TOKENS = 8192
"""Never cut a body chunk below this many tokens: kernels lose efficiency on small chunks (the
fitted 910C curve c / (c + 877) gives 90 % at 8K), and shorter requests, which other requests
keep the pipeline busy around, would mostly pay for more forwards (2K bodies lost to vpp-pack on
the mixed workload of docs/simulator.md with a 30 ms host gap; 16K is too coarse for P = 8 at
512K)."""

SPEC = dataclasses.replace(vpp_pack.SPEC, name=Policy.VPP_TAPER, tapered_chunks=True)
