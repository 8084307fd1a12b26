"""The controller's estimate for an SGLang server on CPU without ``--vpp-cost-profile``.

Why: the generic analytic estimate (``LinearAttentionCost()``) has no per-forward cost, so
``auto`` sees every extra chunk as free and picks the smallest candidate. On this CPU a chunk is
far from free: a forward's cost grows with the request's whole context (the ``(c + L)`` term
below dominates, as if SGLang's ``torch_native`` attention re-read the KV prefix every time),
each stage call has a fixed compute cost, and
the VPP loop spends host time between forwards (scheduling, batch building, messages, processing
results). Served with 512-token chunks, four 8000-token prompts took vpp-pack 5x cpp's
equal-cost prefill makespan (whole-prompt chunks). This estimate carries all three, so the CPU
``auto`` choice weighs fewer, larger chunks against the pipeline bubbles of large ones.

Form: ``FittedCostModel``'s ``a c (c + L) + b (c + L) + d`` per stage (``c`` tokens after a
prefix of ``L``), with ``a`` and ``b`` per layer times the stage's layers and ``d`` = the fixed
compute of a stage call + the host time per forward.

Every number is seconds, measured on the project's 2-vCPU development host with the tiny 8-layer
Qwen2 at pp 2, ``bench-serve --launch cpp,vpp-pack --chunked-prefill-size auto`` with
``--workload short`` (twice) and ``--workload long --input-len 8000``, 3 repeats each
(docs/cpu-measurements.md, "Host time per micro-batch"; ``benchmarks/cpu_host_cost.py``). The
compute terms are that model's on that host (fit residual 37 % RMS, a loaded shared host):
another model on CPU should pass ``--vpp-cost-profile`` (``sglang-vpp bench --costs``); the
host time is the loop's and depends little on the model.
"""

from __future__ import annotations

from .fitted_cost import Coefficients, FittedCostModel
from .layout import Layout

__all__ = ["HOST_GAP_PER_FORWARD_S", "HOST_GAP_RANGE_S", "PAIR_PER_LAYER_S", "CONTEXT_PER_LAYER_S",
           "STAGE_CALL_S", "cpu_serving_cost"]

HOST_GAP_PER_FORWARD_S = 1.02e-3
"""VPP loop (vpp-pack) host time per forward: the scheduler thread's CPU time per micro-batch on
a rank divided by its two forwards; the median of the per-rank medians of the three runs (short,
short again, long; rank 0: 1.02, 1.03 and 1.19 ms, rank 1: 0.81, 0.78 and 1.05 ms)."""

HOST_GAP_RANGE_S = (0.72e-3, 1.28e-3)
"""Plausible range: the smallest and largest per-repeat value over both ranks and workloads."""

PAIR_PER_LAYER_S = 3.5e-9
"""``a`` per layer: per query-key pair of the chunk, ``c (c + L)`` (fitted, relative errors)."""

CONTEXT_PER_LAYER_S = 2.25e-5
"""``b`` per layer: per token of the context ``c + L`` (fitted; the dominant term on this CPU)."""

STAGE_CALL_S = 2.7e-3
"""``d``'s compute part: the fixed cost of one stage call (fitted on 2-layer stages)."""


def cpu_serving_cost(layout: Layout, host_gap_s: float = HOST_GAP_PER_FORWARD_S) -> FittedCostModel:
    """The CPU estimate for every stage of ``layout``: measured compute plus ``host_gap_s`` per
    stage compute (a fold-back rank pays it twice per micro-batch, as measured)."""
    fixed = STAGE_CALL_S + host_gap_s
    stages = {stage.stage_index: Coefficients(PAIR_PER_LAYER_S * stage.num_layers,
                                              CONTEXT_PER_LAYER_S * stage.num_layers, fixed,
                                              num_layers=stage.num_layers)
              for stage in layout.stages}
    return FittedCostModel(stages, meta={"source": "schedule/cpu_cost.py (tiny Qwen2, 2-vCPU host)",
                                         "host_gap_per_forward_s": host_gap_s})
