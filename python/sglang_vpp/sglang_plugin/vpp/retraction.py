"""Decode retraction when the KV pool runs out, with VPP's micro-batch slots.

SGLang retracts decode requests per micro-batch slot: ``ScheduleBatch.retract_decode`` frees the
requests of the slot's own running batch, always keeping one, and when that last request still
cannot get its next token it aborts it (HTTP 500, "Out of memory even after retracting all other
requests in the decode batch"). Stock PP has P slots; VPP has 2P-1 (vpp-pack, vpp-taper and
vpp-stream twice that, see ``Controller.limits.slots``), so the same running requests are spread
thinner, a slot often holds a single request, and a load that stock SGLang serves by retracting ends with
requests aborted under VPP (measured: 8 prompts of 200-291 tokens with 450 new tokens each,
``--max-total-tokens 3000``, pp 2: stock cpp served all 8, vpp-pack aborted 4).

While another request still holds KV (running in another slot, or being prefilled), the pool is
not too small for this one: that request's KV is freed when it finishes or is retracted in its
own slot. So the last request is retracted (back to the waiting queue, its output kept) instead
of aborted. Only when no other request holds KV does SGLang's abort stand (the request cannot fit
at all). Every rank replays the same scheduling steps on equal pools, so every rank decides alike.

    managers.schedule_batch.ScheduleBatch.retract_decode  AROUND  retract, not abort, the last request
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable

__all__ = ["RATIO_AFTER_RETRACT", "RETRACT_DECODE", "around_retract_decode"]

logger = logging.getLogger(__name__)

RETRACT_DECODE = "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode"
RATIO_AFTER_RETRACT = ("sglang.srt.managers.scheduler_components.new_token_ratio_tracker."
                       "NewTokenRatioTracker.estimate_new_token_ratio_after_retract")


def _ratio_after_retract(reqs: list[Any]) -> float:
    module, cls, name = RATIO_AFTER_RETRACT.rsplit(".", 2)
    return getattr(getattr(importlib.import_module(module), cls), name)(reqs)


def _other_requests_hold_kv(batch: Any) -> bool:
    pool = batch.req_to_token_pool
    return pool.available_size() < pool.size


def around_retract_decode(original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
    retracted, new_token_ratio, to_abort = original(batch, *args, **kwargs)
    # SGLang empties the batch only by aborting its last request (the others are retracted or,
    # for beam groups, aborted before it), so an empty batch means to_abort[-1] is that request.
    # Its KV is already released and the request reset as for a retraction.
    if batch.reqs or not to_abort or to_abort[-1].beam_group is not None:
        return retracted, new_token_ratio, to_abort
    if not _other_requests_hold_kv(batch):
        return retracted, new_token_ratio, to_abort
    last = to_abort[-1]
    last.to_finish = None
    logger.info("VPP: request %s retracted instead of aborted: other requests hold KV", last.rid)
    # SGLang estimated the ratio over the requests left in this slot: none, so 0. The scheduler
    # sets its admission ratio to this value, and 0 would let prefill reserve no decode room and
    # re-admit the request at once; estimate it, as SGLang does after a retraction, from the
    # request that goes back to the queue.
    return [*retracted, last], max(new_token_ratio, _ratio_after_retract([last])), to_abort[:-1]
