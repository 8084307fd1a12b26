"""``vpp-pack``: vpp-async plus cross-request pipelined packing.

The fold-back modes run one V per request: the next request would enter stage 0 only once the
previous one has left the last stage. When a request's last chunk has left stage 0, though, rank
0 faces a drain window: the remaining stages of that chunk run elsewhere while rank 0 only has
the fold-back work of the chunks in flight. The planner estimates that window once per draining
request (``Planner._drain_budget``, a projection of the chunks in flight) and starts the next
chunks in the queue, the next request's cheapest leading chunks first, while their estimated
stage-0 cost fits. Chunks that do not fit wait for the barrier as usual.
"""

import dataclasses

from . import vpp_async
from .spec import Policy

SPEC = dataclasses.replace(vpp_async.SPEC, name=Policy.VPP_PACK, pack=True)
