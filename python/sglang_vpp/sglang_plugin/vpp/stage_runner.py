"""Run one virtual stage of one micro-batch on this rank, through SGLang's own worker.

Data flow for a micro-batch on a rank that owns stages ``a < b``:

    first owned stage a:  resolve_forward_inputs -> ForwardBatch.init_new (once, kept on the job)
                          -> model_worker.forward_batch_generation(forward_batch=fb, proxy)
                          -> PPProxyTensors out (hidden_states, residual)
    second owned stage b: same ForwardBatch, so the batch's KV slots, positions and attention
                          metadata are those computed when the batch was scheduled, even if the
                          scheduler has since mutated request state for later micro-batches.
    last stage (rank 0):  Scheduler.run_batch(batch, proxy) with ``ForwardBatch.init_new``
                          answering the kept ForwardBatch: sampling, the future-map relay and
                          logprob bookkeeping run exactly as in stock SGLang.

Both stages of a batch on one rank write disjoint layers of the same KV slots (allocated once
per batch in ``prepare_for_extend`` / ``prepare_for_decode``).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

from .ownership import forward_range
from .state import get_state, stage_context

__all__ = ["StageJob", "run_stage", "around_forward_batch_init_new"]

_REUSE: contextvars.ContextVar[tuple[Any, Any] | None] = contextvars.ContextVar("sglang_vpp_reuse_fb", default=None)


@dataclass
class StageJob:
    """A micro-batch on this rank, between its first and its last owned stage."""

    seq: int
    """Admission order at stage 0; every stage processes micro-batches in this order."""
    slot: int
    """Micro-batch slot (SGLang's ``mb_id``) the scheduler keeps the batch in."""
    batch: Any
    """The ``ScheduleBatch`` (each rank holds its own replica)."""
    forward_batch: Any = None
    is_prefill: bool = True
    num_tokens: int = 0


def around_forward_batch_init_new(original, cls, batch, model_runner, *args, **kwargs):
    """Hand back the kept ForwardBatch for the batch whose last stage is running."""
    reuse = _REUSE.get()
    if reuse is not None and reuse[0] is batch:
        return reuse[1]
    return original(cls, batch, model_runner, *args, **kwargs)


def run_stage(scheduler: Any, job: StageJob, stage: int, tensors: dict | None) -> Any:
    """Run virtual stage ``stage`` of ``job``; returns SGLang's ``GenerationBatchResult``."""
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, PPProxyTensors

    state = get_state()
    assert state is not None and state.layout is not None
    runner = scheduler.tp_worker.model_runner
    proxy = PPProxyTensors(tensors) if tensors is not None else None
    with stage_context(stage), forward_range(runner.model, stage):
        if job.forward_batch is None:
            resolve_forward_inputs(job.batch, scheduler.future_map)
            job.forward_batch = ForwardBatch.init_new(job.batch, runner, return_hidden_states_before_norm=False)
        if stage == state.layout.last_stage:
            token = _REUSE.set((job.batch, job.forward_batch))
            try:
                return scheduler.run_batch(job.batch, proxy)
            finally:
                _REUSE.reset(token)
        return scheduler.model_worker.forward_batch_generation(
            None, forward_batch=job.forward_batch, pp_proxy_tensors=proxy
        )
