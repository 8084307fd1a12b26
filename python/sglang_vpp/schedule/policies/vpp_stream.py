"""``vpp-stream``: the fold-back pipeline with requests streaming through it, for mixed traffic.

The paper's modes run one V per request (the request barrier): the next request enters stage 0
only once the previous one has left the last stage, and vpp-pack lets only the next request's
first chunks into the drain window. That is right for one long prompt, where the pipeline is
full of one request's chunks, and wrong for mixed traffic: a request of one or two micro-batches
crosses 2P virtual stages alone while the rest of the pipeline idles (at P = 8 on the mixed
workload of docs/simulator.md, batching whole requests, vpp-pack's ranks are idle 42 % of the
time, nearly all of it waiting upstream; with partial fill a filled forward chains the next
request into the group and most of that idle goes).
This mode keeps everything of vpp-async (fold-back layout, two groups, async
sends, fixed chunks) and changes three rules, each decided in ``Controller``:

- **No request barrier.** Micro-batches of any request enter stage 0 as the in-flight limit
  allows, in the order SGLang (or the planner) offers them, as in CPP. On rank ``r`` the V then
  pairs the forward stage of a new request's cheap first chunk with the fold-back stage of an
  older request's expensive late chunk: the pairing of method section 3.2 across requests.
- **Deep window** (``deep_window``): up to 2(2P-1) micro-batches in flight instead of 2P-1
  while the ones in flight differ in cost. 2P-1 keeps every rank busy only when consecutive
  micro-batches cost the same; mixed traffic puts a 100K-prefix chunk next to a batch of short
  prompts, and the extra micro-batches queue in front of the slow stage instead of leaving the
  other ranks idle. When they cost the same (batches of equal short prompts) the extra ones
  would only wait in that queue and finish later, so the window stays at 2P-1
  (``Controller.deep_window_open``, ``DEEP_WINDOW_SPREAD``). The slot count is vpp-pack's,
  which SGLang already reserves.
- **Finish first once full** (``Priority.FEED_PEER_UNTIL_FULL``): rank 0 holds stage 0 and the
  last stage. While fewer than 2P-1 micro-batches are in flight a peer may starve, so it feeds
  the pipeline first (vpp-async's rule); once 2P-1 are in flight every rank has work queued, so
  it runs the last stage of the oldest micro-batch first, which completes requests sooner (TTFT)
  and frees its slot, instead of running ever further ahead.

A single request (the long workload, one at a time) is planned exactly as by vpp-pack; the
window and order only differ when several requests are in flight.
"""

import dataclasses

from . import vpp_async
from .spec import Policy, Priority

SPEC = dataclasses.replace(vpp_async.SPEC, name=Policy.VPP_STREAM, request_barrier=False,
                           priority=Priority.FEED_PEER_UNTIL_FULL, deep_window=True)
