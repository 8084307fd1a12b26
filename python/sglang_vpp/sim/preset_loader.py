"""Preset loading: model and hardware descriptions are data files, not code.

``presets/models/<name>.json`` -> ``ModelSpec``; ``presets/hardware/<name>.json`` -> ``HardwareSpec``.
Every numeric field is ``{"value": <number>, "source": "<where it comes from>"}`` (plain values are
accepted in user files); keys starting with ``_`` are comments. A name that is not a preset may
be a path to a JSON file of the same shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .errors import PresetError
from .hardware_spec import HardwareSpec
from .model_spec import ModelSpec

__all__ = ["PHYSICAL_RANGES", "list_models", "list_hardware", "load_model", "load_hardware", "read_preset"]


def _names(kind: str) -> list[str]:
    folder = resources.files("sglang_vpp.sim") / "presets" / kind
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def list_models() -> list[str]:
    return _names("models")


def list_hardware() -> list[str]:
    return _names("hardware")


def _what(kind: str) -> str:
    return "model" if kind == "models" else "hardware"


def read_preset(kind: str, name: str) -> tuple[dict, dict, str]:
    """(values, sources, note) of preset ``name`` (or a JSON file path) of ``kind``."""
    if name in _names(kind):
        text = (resources.files("sglang_vpp.sim") / "presets" / kind / f"{name}.json").read_text()
    elif name.endswith(".json") and Path(name).exists():
        try:
            text = Path(name).read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or error
            raise PresetError(f"{_what(kind)} preset {name!r} cannot be read ({reason}); give a .json file "
                              f"like a shipped preset ({', '.join(_names(kind))})") from None
    elif name.endswith(".json"):
        raise PresetError(f"{_what(kind)} preset file {name!r} does not exist; give a shipped preset "
                          f"({', '.join(_names(kind))}) or the path to a .json file of the same shape")
    else:
        raise PresetError(f"unknown {_what(kind)} preset {name!r}; valid: {', '.join(_names(kind))} "
                          f"(or a path to a .json file of the same shape)")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise PresetError(f"{_what(kind)} preset {name!r} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise PresetError(f"{_what(kind)} preset {name!r} holds {type(raw).__name__}, not a JSON object of "
                          f"fields like a shipped preset ({', '.join(_names(kind))})")
    values, sources = {}, {}
    for key, entry in raw.items():
        if key.startswith("_"):
            continue
        if isinstance(entry, dict) and "value" in entry:
            values[key] = entry["value"]
            sources[key] = entry.get("source", "")
        else:
            values[key] = entry
    return values, sources, str(raw.get("_comment", ""))


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
_SHARE = _Range(False, 0.0, 1.0, "a share of peak or of the transfer", open_low=True)
_RATE = _Range(False, 0.0, 1e18, "per second", open_low=True)
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
        "peak_flops": _Range(False, 0.0, 1e18, "FLOP/s of one chip", open_low=True),
        "hbm_bytes_per_s": _RATE,
        "tp_bytes_per_s": _RATE,
        "tp_latency_s": _SECONDS,
        "pp_bytes_per_s": _RATE,
        "pp_latency_s": _SECONDS,
        "linear_efficiency": _SHARE,
        "attention_efficiency": _SHARE,
        "indexer_efficiency": _SHARE,
        "half_efficiency_tokens": _Range(False, 0.0, float(1 << 24), "tokens"),
        "layer_overhead_s": _SECONDS,
        "chunk_overhead_s": _SECONDS,
        "tp_exposed_fraction": _SHARE,
        "pp_tensors": _count(16, "hidden-size tensors a pipeline hop carries per token", 1),
    },
}
"""Every numeric field of a model or hardware preset and the values that make physical sense: a
count is whole, a size, rate or byte width is above 0, a time or overhead is at least 0 and at most
a second, an efficiency or share lies in (0, 1]. Each spec still checks how fields combine (an mla
model's head sizes, a MoE's experts); ``tests/sim/test_presets.py`` checks every field has a range."""


def _build(cls, kind: str, name: str):
    values, sources, note = read_preset(kind, name)
    known = {f.name for f in dataclasses.fields(cls)} - {"sources", "calibration_note"}
    unknown = sorted(set(values) - known)
    if unknown:
        raise PresetError(f"{_what(kind)} preset {name!r}: unknown fields {', '.join(unknown)}; known fields: {', '.join(sorted(known))}")
    required = sorted(f.name for f in dataclasses.fields(cls) if f.name in known and f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING)
    missing = [field for field in required if field not in values]
    if missing:
        raise PresetError(f"{_what(kind)} preset {name!r}: missing fields {', '.join(missing)}; copy a shipped preset "
                          f"({', '.join(_names(kind))}) and edit it")
    ranges = PHYSICAL_RANGES[kind]
    for key, value in values.items():
        if key in ranges and not ranges[key].holds(value):
            raise PresetError(f"{_what(kind)} preset {name!r}: {key} is {value!r}, not {ranges[key].text()}")
        if key not in ranges and not isinstance(value, str):
            raise PresetError(f"{_what(kind)} preset {name!r}: {key} is {value!r}, not a string")
    extra = {"calibration_note": note} if cls is HardwareSpec else {}
    try:
        return cls(sources=sources, **values, **extra)
    except TypeError as error:
        raise PresetError(f"{_what(kind)} preset {name!r}: {error}") from None


def load_model(name: str) -> ModelSpec:
    return _build(ModelSpec, "models", name)


def load_hardware(name: str) -> HardwareSpec:
    return _build(HardwareSpec, "hardware", name)
