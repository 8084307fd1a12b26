"""Physical ranges of the analytic cost model's calibrated hardware fields, each with its source.

A calibration (``sim.calibration``) may move a field only inside its range; a fit that ends on
a bound is reported as such (docs/calibration.md), because it means the model lacks a mechanism
that the measurement has, and the bound, not the data, set the value. ``assumed`` marks ranges
that no public measurement pins down; the rest come from public material named in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PhysicalRange", "PRIORS", "prior"]


@dataclass(frozen=True, slots=True)
class PhysicalRange:
    low: float
    high: float
    source: str
    assumed: bool = False

    def contains(self, value: float, tolerance: float = 1e-9) -> bool:
        return self.low * (1 - tolerance) <= value <= self.high * (1 + tolerance)

    def at_bound(self, value: float, tolerance: float = 1e-3) -> str | None:
        """``"low"`` or ``"high"`` when ``value`` sits on that bound (relative ``tolerance``)."""
        if abs(value - self.low) <= tolerance * max(abs(self.low), 1e-30):
            return "low"
        if abs(value - self.high) <= tolerance * max(abs(self.high), 1e-30):
            return "high"
        return None


PRIORS: dict[str, PhysicalRange] = {
    "attention_efficiency": PhysicalRange(
        0.2, 0.75, "long-context flash attention reaches 35-75 % of dense BF16 peak (FlashAttention-2/3 "
        "papers on A100/H100); NPU kernels assumed to stay inside the same range"),
    "linear_efficiency": PhysicalRange(
        0.2, 0.8, "large GEMMs reach 60-80 % of peak; grouped MoE GEMMs with 8 of 256 experts active per "
        "token run well below that", assumed=True),
    "half_efficiency_tokens": PhysicalRange(
        128.0, 4096.0, "GEMM and attention kernels fill the device once the token dimension covers a few "
        "tiles per core: half efficiency between ~128 and ~4K tokens", assumed=True),
    "tp_latency_s": PhysicalRange(
        5e-6, 2.5e-4, "fixed cost of one all-reduce over 8 devices: ~10-30 us in nccl-tests on NVLink, "
        "~0.12-0.23 ms through PyTorch for 0.1-1 MB messages on 8 H100 (IBM/pytorch-communication-benchmarks "
        "issue #1); HCCL on HCCS assumed in the same range"),
    "tp_exposed_fraction": PhysicalRange(
        0.3, 1.0, "share of the all-reduce transfer not hidden behind math: SGLang runs prefill TP "
        "collectives inline (1.0); overlap below 0.3 needs communication-computation fusion", assumed=True),
    "chunk_overhead_s": PhysicalRange(
        1e-4, 3e-2, "host time per micro-batch and rank, before its first forward there, with the device idle: from a few kernel launches "
        "(5-50 us each, CUDA/CANN) to a Python scheduler iteration (milliseconds; SGLang overlaps most of it "
        "only in its non-PP loop)", assumed=True),
    "revisit_overhead_s": PhysicalRange(
        1e-5, 3e-2, "host time before a fold-back rank's second forward of a micro-batch it has set up: "
        "from the stage switch alone (0.02 ms before the served CPU loop's fold-back stage at the fold "
        "rank) to a whole scheduler iteration (at most chunk_overhead_s, checked)", assumed=True),
    "layer_overhead_s": PhysicalRange(
        1e-6, 1e-3, "launches and small ops per layer: ~20 kernels x 5-50 us", assumed=True),
    "indexer_efficiency": PhysicalRange(
        0.1, 0.75, "DSA indexer scoring kernel (FP8 on real parts); no public measurement", assumed=True),
}


def prior(name: str) -> PhysicalRange:
    return PRIORS[name]
