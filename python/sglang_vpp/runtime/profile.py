"""Start-up latency profile of one decoder layer: the planner's cost estimate for a real model.

Why: the planner orders work and DCPP sizes its chunks from a ``StageCostModel`` estimate. The
schedule core's default (``LinearAttentionCost``) knows nothing about the model at hand; SGLang's
DCPP profiles prefill latency at start-up instead. This module does the same, cheaply: it times
one layer of the model on synthetic chunks of several sizes against synthetic KV prefixes of
several lengths (the attention cost does not depend on the cached values), and fits
``f(c, L) = a c (c + L) + b (c + L) + d`` per layer with the simulator's fitter.

Data flow: ``ModelSource`` + chunk size + longest prompt -> ``profile_layer`` (thread CPU seconds
per (c, L) point) -> ``sim.FittedCostModel`` with a per-layer fit -> ``RunSpec.planner_cost``
(stage cost = per-layer cost x the stage's layers).
"""

from __future__ import annotations

import time

import torch

from ..schedule import ChunkSpec
from ..schedule.fitted_cost import FittedCostModel
from ..sim.cost.fitted import fit_coefficients
from ..sim.cost.samples import CostSample
from .models import ModelSource, StageModel
from .models.kv_cache import StageKV
from .models.weights import init_random_

__all__ = ["profile_layer", "profiled_cost_model"]


FIT_POINTS = 3
"""The fit has three coefficients: it needs at least three (chunk, prefix) points."""


def _points(chunk_size: int, max_length: int) -> list[tuple[int, int]]:
    sizes = sorted({max(1, chunk_size // 4), max(1, chunk_size // 2), chunk_size})
    prefixes = sorted({0, max_length // 4, max_length // 2, max(0, max_length - chunk_size)})
    points = [(c, p) for p in prefixes for c in sizes]
    # A one- or two-token prompt gives fewer: time a few larger chunks too (the fit's curve, not the run).
    larger = chunk_size
    while len(points) < FIT_POINTS:
        larger += 1
        points.append((larger, 0))
    return points


@torch.inference_mode()
def profile_layer(source: ModelSource, chunk_size: int, max_length: int, repeats: int = 2) -> list[CostSample]:
    """Thread CPU seconds of one decoder layer per (chunk tokens, prefix) point (best of ``repeats``)."""
    config = source.config
    index = config.num_hidden_layers - 1  # a routed-expert layer when the model has any
    layer = StageModel(config, [index], has_embedding=False, has_head=False)
    init_random_(layer, source.seed)  # values do not matter for timing
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    samples = []
    try:
        for tokens, prefix in _points(chunk_size, max_length):
            best = float("inf")
            for _ in range(repeats):
                kv = StageKV(prefix + tokens, 0 if config.is_mla else 1)
                if prefix:
                    _fill_prefix(layer, kv, index, prefix)
                hidden = torch.randn(tokens, config.hidden_size)
                chunk = ChunkSpec(0, 0, prefix, tokens, True)
                start = time.thread_time()
                layer.forward_stage(hidden, chunk, index, index + 1, kv, False, False)
                best = min(best, time.thread_time() - start)
            samples.append(CostSample("compute", 0, 0, 0, prefix, tokens, best, 1))
    finally:
        torch.set_num_threads(threads)
    return samples


def _fill_prefix(layer: StageModel, kv: StageKV, index: int, prefix: int) -> None:
    """A synthetic KV prefix of ``prefix`` tokens (shapes as the layer's attention writes them)."""
    config = layer.config
    cache = kv.layer(index)
    if config.is_mla:
        a = torch.randn(prefix, config.kv_lora_rank)
        b = torch.randn(prefix, config.qk_rope_head_dim)
    else:
        a = torch.randn(config.num_key_value_heads, prefix, config.head_dim)
        b = torch.randn(config.num_key_value_heads, prefix, config.head_dim)
    cache.append(0, a, b)


def profiled_cost_model(source: ModelSource, chunk_size: int, max_length: int) -> FittedCostModel:
    """A per-layer ``FittedCostModel`` from ``profile_layer`` (the planner's estimate)."""
    samples = profile_layer(source, chunk_size, max_length)
    per_layer = fit_coefficients(samples, per_layer=True)
    return FittedCostModel({}, per_layer, None, {"source": "runtime start-up profile", "model": source.label})
