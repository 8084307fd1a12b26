"""Decode in steady state: the time per generated token (ITL) of running requests under a mode.

The event simulation plans prefill only; this is the closed-form steady state of decode with the
same cost model, for the question prefill cannot answer: what a mode's micro-batches and
forwards cost per generated token.

Model (``estimate_decode``): ``running`` requests, each with ``context`` tokens of KV, are spread
evenly over ``S`` decode micro-batches: the controller's decode slots
(``Controller.decode``, ``schedule/decode_groups.py``: P for every mode, stock PP's count), or,
with ``all_slots``, every micro-batch slot the mode opens (``Controller.limits.slots``: P for
stock PP, 2P-1 for vpp and vpp-async, 2(2P-1) for the packing modes and vpp-stream), as
SGLang's own PP loop does when a request decodes in the slot its prefill ran in. One *round*
moves every decode micro-batch one token:

- every rank runs each of its stages once per micro-batch (one forward per micro-batch under
  stock PP, two under fold-back), so a round costs rank r ``S * sum of its stage times``, each
  stage time the cost model's for a forward of ``running / S`` one-token requests (weight
  streaming, host time and TP collectives are paid per forward, a fold-back rank's second
  forward of a micro-batch paying the revisit instead of an iteration, so more, smaller
  micro-batches cost more per token);
- a micro-batch's trip through every stage and pipeline hop takes ``T``; with at most ``W``
  micro-batches in flight (the controller's limit with only decode in flight,
  ``Controller.in_flight_limit``: 2P-1 for vpp-stream too, whose deeper window opens for uneven
  prefill only), a round takes at least ``S / W * T``.

``itl_s`` is the larger of the two. With P decode micro-batches a fold-back mode runs the same
layers per round as stock PP in twice the forwards, so when the ranks bound the round its ITL
exceeds stock PP's by P times (per-forward cost of a half stage), and when the trips bound it by
the P - 1 extra hops and the extra forwards of one trip. Not modelled: KV-cache reads (the
analytic model counts attention as FLOPs), prefill micro-batches interleaved with decode, and
uneven slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..schedule import ChunkSpec, Fold, StageCostModel, build_controller, controller_config, get_policy, policy_layout
from .cost.base import stage_time

__all__ = ["DecodeEstimate", "estimate_decode", "decode_micro_batch"]


@dataclass(frozen=True, slots=True)
class DecodeEstimate:
    mode: str
    slots: int
    """Decode micro-batches the running requests are spread over."""
    requests_per_micro_batch: int
    """Of the fullest slot."""
    forwards_per_round: int
    """Forwards the rank with the most stages runs while every running request gains one token."""
    rank_round_s: float
    """The busiest rank's compute per round."""
    trip_s: float
    """One micro-batch through every stage and hop."""
    itl_s: float

    @property
    def bound(self) -> str:
        return "ranks busy" if self.rank_round_s >= self.itl_s else "trips in flight"


def decode_micro_batch(num_requests: int, context: int) -> ChunkSpec:
    """One decode forward: ``num_requests`` requests, one new token each after ``context`` tokens."""
    rest = tuple(ChunkSpec(i, 0, context, 1, True) for i in range(1, num_requests))
    return ChunkSpec(0, 0, context, 1, True, batch=rest)


def estimate_decode(mode: str, num_ranks: int, num_layers: int, cost: StageCostModel, running: int,
                    context: int, all_slots: bool = False, fold: Fold | str = Fold.SPLIT) -> DecodeEstimate:
    """The steady state of ``running`` decoding requests with ``context`` tokens each (module doc);
    ``all_slots``: spread over every slot of the mode instead of its decode slots; ``fold``: a
    fold-back mode's fold (a fused fold runs one forward per micro-batch on rank P-1)."""
    if running < 1:
        raise ValueError(f"running requests must be >= 1, got {running}")
    if context < 0:
        raise ValueError(f"context must be >= 0 tokens, got {context}")
    spec = get_policy(mode)
    layout = policy_layout(spec, num_ranks, num_layers, None, fold)
    # The slots a server opens for this mode (its controller's limits; the chunk size plays no part).
    controller = build_controller(controller_config(spec, layout, 1, cost, 1))
    limits = controller.limits
    slots = min(limits.slots if all_slots else len(controller.decode.decode_slots), running)
    per_slot = math.ceil(running / slots)
    chunk = decode_micro_batch(per_slot, context)
    times = [stage_time(cost, stage, chunk).total_s for stage in layout.stages]
    hops = sum(cost.transfer_cost(stage, chunk) for stage, after in zip(layout.stages, layout.stages[1:])
               if stage.rank != after.rank)
    trip = sum(times) + hops
    per_rank = [sum(times[s.stage_index] for s in layout.stages if s.rank == rank) for rank in range(num_ranks)]
    rank_round = slots * max(per_rank)
    in_flight = min(controller.in_flight_limit, slots)  # decode is never packed, and opens no deep window
    itl = max(rank_round, slots / in_flight * trip)
    forwards = slots * max(len(layout.stages_of(rank)) for rank in range(num_ranks))
    return DecodeEstimate(str(spec.name), slots, per_slot, forwards, rank_round, trip, itl)
