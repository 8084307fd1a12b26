"""The controller's estimate for an SGLang server on CPU without ``--vpp-cost-profile``.

Why: the generic analytic estimate (``LinearAttentionCost()``) has no per-forward cost, so
``auto`` sees every extra chunk as free and picks the smallest candidate. On a CPU server each
forward also costs the VPP loop's host time between forwards (scheduling, batch building,
messages, processing results), measured by ``bench-serve --launch`` (``serving/host_time.py``);
this estimate carries it as the fixed cost of every stage compute, next to compute terms
measured on the same runs, so the CPU ``auto`` choice weighs fewer, larger chunks against the
pipeline bubbles of large ones.

Every number is seconds, measured on the project's 2-vCPU development host with the tiny
8-layer Qwen2 at pp 2 (docs/cpu-measurements.md, "Host time per micro-batch"). The compute
terms are that model's: another model on CPU should pass ``--vpp-cost-profile`` (``sglang-vpp
bench --costs``); the host gap is the loop's and depends little on the model.
"""

from __future__ import annotations

from .cost import LinearAttentionCost

__all__ = ["HOST_GAP_PER_FORWARD_S", "HOST_GAP_RANGE_S", "LINEAR_PER_TOKEN_S", "ATTENTION_PER_PAIR_S",
           "cpu_serving_cost"]

HOST_GAP_PER_FORWARD_S = 3e-3
"""VPP loop (vpp-pack), scheduler thread CPU between two forwards of a rank, median over
forwards; the median of the repeats of the short and long workloads with ``auto``."""

HOST_GAP_RANGE_S = (1e-3, 1e-2)
"""Plausible range: the smallest and largest per-repeat median over both ranks and workloads."""

LINEAR_PER_TOKEN_S = 5e-6
"""Per layer and token of a prefill forward (thread CPU time), fitted on the same runs."""

ATTENTION_PER_PAIR_S = 5e-9
"""Per layer and causal query-key pair, fitted on the same runs."""


def cpu_serving_cost(host_gap_s: float = HOST_GAP_PER_FORWARD_S) -> LinearAttentionCost:
    """The CPU estimate: measured compute terms plus ``host_gap_s`` per stage compute."""
    return LinearAttentionCost(LINEAR_PER_TOKEN_S, ATTENTION_PER_PAIR_S, host_gap_s)
