"""Chunk sizes from the schedule core for modes that do not cut fixed chunks (``--pp-mode vpp-taper``).

The planner, the simulator and the reference runtime cut requests with
``schedule.default_chunker`` (for vpp-taper a ``TaperedChunker``); the server cuts them with the
same object, so one place decides every chunk size. SGLang already varies chunk sizes through
its dynamic-chunking slot, ``Scheduler.dynamic_chunk_sizer``, whose ``predict(history_len)`` sets
the token budget of the batch that continues the chunked request. ``ScheduleChunkSizer`` fills
that slot, and a second hook asks it for the first chunk of a request, which SGLang always cuts
at ``--chunked-prefill-size``:

    managers.scheduler.Scheduler.maybe_init_dynamic_chunk_sizer  AFTER   fill the slot
    managers.schedule_policy.PrefillAdder.add_one_req            AROUND  first chunk of a request

Every rank replays the same scheduling decisions (``replica.py``) and the chunker is a pure
function of (prefix, remaining), so every rank cuts the same chunks.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sglang_vpp.schedule import Chunker, default_chunker

from .state import get_state

__all__ = ["ScheduleChunkSizer", "after_init_chunk_sizer", "around_add_one_req", "MAYBE_INIT", "ADD_ONE_REQ"]

logger = logging.getLogger(__name__)

_P = "sglang.srt."
MAYBE_INIT = _P + "managers.scheduler.Scheduler.maybe_init_dynamic_chunk_sizer"
ADD_ONE_REQ = _P + "managers.schedule_policy.PrefillAdder.add_one_req"

_sizer: ScheduleChunkSizer | None = None
"""This process's sizer (one scheduler per process); the adder hook has no scheduler to ask."""


class ScheduleChunkSizer:
    """SGLang's ``DynamicChunkSizer`` interface over a schedule-core ``Chunker``."""

    def __init__(self, scheduler: Any, chunker: Chunker) -> None:
        self.scheduler = scheduler
        self.chunker = chunker

    def size(self, prefix_len: int, length: int) -> int:
        """Tokens of the next chunk of a ``length``-token sequence with ``prefix_len`` computed."""
        return self.chunker.next_chunk_size(prefix_len, max(1, length - prefix_len))

    def predict(self, history_len: int) -> int | None:
        """Budget of the batch that continues ``scheduler.chunked_req`` (SGLang calls this)."""
        req = self.scheduler.chunked_req
        if req is None:
            return None
        return self.size(history_len, _length(req))


def _length(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def after_init_chunk_sizer(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """Put the schedule core's chunker into SGLang's dynamic-chunking slot."""
    global _sizer
    state = get_state()
    if state is None or not state.config.policy.tapered_chunks:
        return None
    assert state.layout is not None, "the layout is built with the model, before the chunk sizer"
    chunk_size = int(scheduler.chunked_prefill_size)
    chunker = default_chunker(state.config.policy, chunk_size, state.layout, state.cost_model(), chunk_size)
    _sizer = ScheduleChunkSizer(scheduler, chunker)
    scheduler.dynamic_chunk_sizer = _sizer
    logger.info("VPP %s: chunk sizes from the schedule core (%s)", state.config.mode, chunker)
    return None


def around_add_one_req(original: Callable[..., Any], adder: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """Cut a new request's first chunk where the chunker says, when that is below the budget.

    The chunk closes the batch, as a chunk cut at the full budget does in stock SGLang.
    """
    budget = adder.rem_chunk_tokens
    if _sizer is None or budget is None:
        return original(adder, req, *args, **kwargs)
    prefix_len = int(req.prefix_len)
    length = _length(req)
    first = _sizer.size(prefix_len, length)
    if first >= min(budget, length - prefix_len):
        return original(adder, req, *args, **kwargs)
    adder.rem_chunk_tokens = first
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        if adder.new_chunked_req is not req:  # not admitted: the rest of the budget stays usable
            adder.rem_chunk_tokens = budget - (first - adder.rem_chunk_tokens)
