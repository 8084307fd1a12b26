"""The values each numeric field of a model or hardware preset may hold (``PHYSICAL_RANGES``):
the preset loader refuses a file outside them, and ``HardwareSpec`` and ``ModelSpec`` a value
outside them however it was built (a calibration's ``dataclasses.replace`` included)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import PresetError

__all__ = ["PHYSICAL_RANGES", "check_ranges", "range_problem"]


@dataclass(frozen=True, slots=True)
class _Range:
    """The values a preset field may hold: whole numbers or finite numbers in ``[low, high]``
    (``(low, high]`` where ``open_low``)."""

    whole: bool
    low: float
    high: float
    unit: str
    open_low: bool = False

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.whole and not isinstance(value, int):
            return False
        return (value > self.low if self.open_low else value >= self.low) and value <= self.high

    def text(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        return f"{kind} in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}] ({self.unit})"


def _count(high: float, unit: str, low: int = 0) -> _Range:
    return _Range(True, low, high, unit)


_SECONDS = _Range(False, 0.0, 1.0, "seconds")
_SHARE = _Range(False, 0.0, 1.0, "a share of the transfer", open_low=True)
# Rates and efficiencies divide work: near 0 (1e-300) they turn stage times into inf, which the
# planner cannot place; the preset is where that is wrong, so the preset check refuses it.
_EFFICIENCY = _Range(False, 1e-3, 1.0, "a share of peak")
_RATE = _Range(False, 1.0, 1e18, "per second")
_BYTES = _Range(False, 0.0, 8.0, "bytes per value", open_low=True)

PHYSICAL_RANGES: dict[str, dict[str, _Range]] = {
    "models": {
        "num_layers": _count(4096, "decoder layers", 1),
        "hidden_size": _count(1 << 20, "hidden size", 1),
        "num_heads": _count(65536, "attention heads", 1),
        "num_kv_heads": _count(65536, "KV heads; 0 for mla"),
        "head_dim": _count(65536, "per head; 0 for mla"),
        "q_lora_rank": _count(1 << 20, "0: no query compression"),
        "kv_lora_rank": _count(1 << 20, "0 for gqa"),
        "qk_nope_head_dim": _count(65536, "per head; 0 for gqa"),
        "qk_rope_head_dim": _count(65536, "per head; 0 for gqa"),
        "v_head_dim": _count(65536, "per head; 0 for gqa"),
        "first_dense_layers": _count(4096, "leading dense layers"),
        "dense_intermediate": _count(1 << 24, "dense FFN width; 0 without dense layers"),
        "num_experts": _count(1 << 20, "routed experts; 0: dense"),
        "num_active_experts": _count(1 << 20, "routed experts per token"),
        "num_shared_experts": _count(1 << 20, "shared experts"),
        "expert_intermediate": _count(1 << 24, "expert FFN width"),
        "sparse_top_k": _count(1 << 30, "keys per query; 0: dense attention"),
        "indexer_heads": _count(65536, "DSA indexer heads"),
        "indexer_head_dim": _count(65536, "DSA indexer head size"),
        "weight_bytes": _BYTES,
        "activation_bytes": _BYTES,
        "tp_collectives_per_layer": _count(64, "collectives per layer under TP"),
    },
    "hardware": {
        "tp_size": _count(65536, "chips per pipeline rank", 1),
        "peak_flops": _Range(False, 1.0, 1e18, "FLOP/s of one chip"),
        "hbm_bytes_per_s": _RATE,
        "tp_bytes_per_s": _RATE,
        "tp_latency_s": _SECONDS,
        "pp_bytes_per_s": _RATE,
        "pp_latency_s": _SECONDS,
        "linear_efficiency": _EFFICIENCY,
        "attention_efficiency": _EFFICIENCY,
        "indexer_efficiency": _EFFICIENCY,
        "half_efficiency_tokens": _Range(False, 0.0, float(1 << 24), "tokens"),
        "layer_overhead_s": _SECONDS,
        "chunk_overhead_s": _SECONDS,
        "revisit_overhead_s": _SECONDS,
        "tp_exposed_fraction": _SHARE,
        "pp_tensors": _count(16, "hidden-size tensors a pipeline hop carries per token", 1),
    },
}
"""Every numeric field of a model or hardware preset and the values that make physical sense: a
count is whole, a size or byte width is above 0, a rate at least 1 per second, a time or overhead
is at least 0 and at most a second, an efficiency lies in [0.001, 1] and a share in (0, 1]. Each spec still checks how fields combine (an mla
model's head sizes, a MoE's experts); ``tests/sim/test_presets.py`` checks every field has a range."""


def range_problem(kind: str, field: str, value: object) -> str | None:
    """``"<field> is <value>, not <range>"`` when ``value`` is outside ``field``'s range, else None."""
    limits = PHYSICAL_RANGES[kind][field]
    return None if limits.holds(value) else f"{field} is {value!r}, not {limits.text()}"


def check_ranges(spec: object, kind: str) -> None:
    """PresetError naming the first field of ``spec`` (a ``ModelSpec`` or ``HardwareSpec``) out of range."""
    for field in PHYSICAL_RANGES[kind]:
        problem = range_problem(kind, field, getattr(spec, field))
        if problem is not None:
            raise PresetError(f"{'model' if kind == 'models' else 'hardware'} {spec.name}: {problem}")
