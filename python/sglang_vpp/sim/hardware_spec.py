"""``HardwareSpec``: one pipeline rank's device group (TP chips) and its links, plus the fitted
efficiency numbers of the analytic cost model (calibration; see docs/calibration.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import PresetError
from .physical_ranges import check_ranges

__all__ = ["HardwareSpec"]


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    tp_size: int
    """Chips per pipeline rank (the tensor-parallel group)."""
    peak_flops: float
    """Dense BF16/FP16 FLOP/s of one chip."""
    hbm_bytes_per_s: float
    """Memory bandwidth of one chip."""
    tp_bytes_per_s: float
    """Per-chip bus bandwidth of TP collectives (all-reduce moves 2 (n-1)/n of the data per chip)."""
    tp_latency_s: float
    """Fixed cost of one TP collective."""
    pp_bytes_per_s: float
    """Point-to-point bandwidth of a pipeline hop between ranks."""
    pp_latency_s: float
    """Fixed cost of one pipeline hop (send + receive set-up)."""
    linear_efficiency: float = 0.5
    """Fraction of peak reached by large GEMMs (calibrated)."""
    attention_efficiency: float = 0.5
    """Fraction of peak reached by long-context attention kernels (calibrated)."""
    indexer_efficiency: float = 0.5
    """Fraction of peak reached by the DSA indexer scoring kernel (FP8 on real parts)."""
    half_efficiency_tokens: float = 1024.0
    """Chunk size at which kernels reach half their large-chunk efficiency: eff(c) = eff * c / (c + this)."""
    layer_overhead_s: float = 0.0
    """Fixed device time per layer per chunk (kernel launches, norms, small ops)."""
    chunk_overhead_s: float = 0.0
    """Host time per micro-batch on a rank, before the first forward of it there (the scheduler
    iteration: batch set-up), during which the device idles."""
    revisit_overhead_s: float | None = None
    """Host time before a rank's further forward of a micro-batch it has already set up (a
    fold-back rank's stage on the way back: switching stage, attention metadata, the first
    launch), during which the device idles. The batch is not set up again. At most
    ``chunk_overhead_s``; unset, it is ``chunk_overhead_s`` (every forward a whole iteration),
    resolved when the spec is built (``dataclasses.replace`` of the iteration keeps it)."""
    tp_exposed_fraction: float = 1.0
    """Share of the bandwidth term of TP collectives not overlapped with math (calibrated); the
    per-collective latency is always exposed."""
    pp_tensors: int = 1
    """Hidden-size tensors a pipeline hop carries per token (hidden states; 2 if the residual too)."""
    sources: dict = field(default_factory=dict, compare=False, repr=False)
    calibration_note: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.revisit_overhead_s is None:
            object.__setattr__(self, "revisit_overhead_s", self.chunk_overhead_s)
        check_ranges(self, "hardware")
        if self.revisit_overhead_s > self.chunk_overhead_s:
            raise PresetError(f"hardware {self.name}: revisit_overhead_s is {self.revisit_overhead_s}, above "
                              f"chunk_overhead_s {self.chunk_overhead_s}: a forward of a micro-batch the rank has "
                              "set up costs at most a whole scheduler iteration")
