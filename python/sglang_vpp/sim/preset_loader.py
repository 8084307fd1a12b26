"""Preset loading: model and hardware descriptions are data files, not code.

``presets/models/<name>.json`` -> ``ModelSpec``; ``presets/hardware/<name>.json`` -> ``HardwareSpec``.
Every numeric field is ``{"value": <number>, "source": "<where it comes from>"}`` (plain values are
accepted in user files); keys starting with ``_`` are comments. A name that is not a preset may
be a path to a JSON file of the same shape.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

from .. import json_text
from .errors import PresetError
from .hardware_spec import HardwareSpec
from .model_spec import ModelSpec
from .physical_ranges import PHYSICAL_RANGES, range_problem

__all__ = ["PHYSICAL_RANGES", "list_models", "list_hardware", "load_model", "load_hardware", "preset_file",
           "read_preset"]


def _names(kind: str) -> list[str]:
    folder = resources.files("sglang_vpp.sim") / "presets" / kind
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def list_models() -> list[str]:
    return _names("models")


def list_hardware() -> list[str]:
    return _names("hardware")


def _what(kind: str) -> str:
    return "model" if kind == "models" else "hardware"


def preset_file(kind: str, name: str) -> Path | None:
    """The user's file that ``read_preset`` reads for ``name``; None for a shipped preset (a file
    named like one is not read)."""
    return None if name in _names(kind) or not name.endswith(".json") else Path(name)


def read_preset(kind: str, name: str) -> tuple[dict, dict, str]:
    """(values, sources, note) of preset ``name`` (or a JSON file path) of ``kind``."""
    path = preset_file(kind, name)
    if name in _names(kind):
        text = (resources.files("sglang_vpp.sim") / "presets" / kind / f"{name}.json").read_text()
    elif path is not None and path.exists():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or error
            raise PresetError(f"{_what(kind)} preset {name!r} cannot be read ({reason}); give a .json file "
                              f"like a shipped preset ({', '.join(_names(kind))})") from None
    elif path is not None:
        raise PresetError(f"{_what(kind)} preset file {name!r} does not exist; give a shipped preset "
                          f"({', '.join(_names(kind))}) or the path to a .json file of the same shape")
    else:
        raise PresetError(f"unknown {_what(kind)} preset {name!r}; valid: {', '.join(_names(kind))} "
                          f"(or a path to a .json file of the same shape)")
    try:
        raw = json_text.loads(text)
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
    for key, value in values.items():
        if key in PHYSICAL_RANGES[kind]:
            problem = range_problem(kind, key, value)
            if problem is not None:
                raise PresetError(f"{_what(kind)} preset {name!r}: {problem}")
        elif not isinstance(value, str):
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
