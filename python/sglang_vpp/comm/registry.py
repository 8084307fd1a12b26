"""Backend discovery through the ``sglang_vpp.comm_backends`` entry-point group.

A device package adds a backend without touching the core: its ``pyproject.toml`` declares
``[project.entry-points."sglang_vpp.comm_backends"] nccl = "sglang_vpp_cuda.nccl:NcclBackend"``.
The core knows the names and install commands of its two sibling distributions only to say why a
backend is missing (``KNOWN_BACKENDS``); when such a distribution sits on ``sys.path`` without
being installed, its module path is imported directly; in a source checkout the registry also finds
``backends/cuda`` and ``backends/ascend`` next to ``python/`` and uses them in place.

Specs: ``name`` selects a backend; ``name@double`` builds a device backend (nccl, hccl) on the
gloo-based device test double (``testing.device_double``), so its code runs without hardware.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .base import BackendStatus, CommBackend
from .errors import BackendUnavailableError, CommConfigError, UnknownBackendError

__all__ = [
    "ENTRY_POINT_GROUP",
    "DOUBLE_SUFFIX",
    "KnownBackend",
    "KNOWN_BACKENDS",
    "backend_names",
    "parse_backend_spec",
    "load_backend_class",
    "probe_backend",
    "probe_backends",
    "make_backend",
]

ENTRY_POINT_GROUP = "sglang_vpp.comm_backends"
DOUBLE_SUFFIX = "@double"


@dataclass(frozen=True)
class KnownBackend:
    name: str
    distribution: str
    target: str
    install: str
    source_dir: str = ""
    """Where the distribution lives in a source checkout, relative to the repository root."""


KNOWN_BACKENDS: dict[str, KnownBackend] = {
    "gloo": KnownBackend("gloo", "sglang-vpp", "sglang_vpp.comm.gloo:GlooBackend", "pip install -e ."),
    "nccl": KnownBackend("nccl", "sglang-vpp-cuda", "sglang_vpp_cuda.nccl:NcclBackend",
                         "pip install -e backends/cuda (on a CUDA machine)", "backends/cuda"),
    "hccl": KnownBackend("hccl", "sglang-vpp-ascend", "sglang_vpp_ascend.hccl:HcclBackend",
                         "pip install -e backends/ascend (on an Ascend machine with torch_npu)", "backends/ascend"),
}
# python/sglang_vpp/comm/registry.py -> repository root of a source checkout
_CHECKOUT = Path(__file__).resolve().parents[3]


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def backend_names() -> list[str]:
    """Every backend name: registered entry points plus the known sibling distributions."""
    return sorted(set(_entry_points()) | set(KNOWN_BACKENDS))


def parse_backend_spec(spec: str) -> tuple[str, bool]:
    """``"hccl@double"`` -> ``("hccl", True)``; validates the name, and that a double is asked
    of a device backend."""
    if not isinstance(spec, str) or not spec:
        raise CommConfigError(f"backend spec must be a non-empty string, got {spec!r}. Fix: e.g. 'gloo'.")
    double = spec.endswith(DOUBLE_SUFFIX)
    name = spec[: -len(DOUBLE_SUFFIX)] if double else spec
    if name not in backend_names():
        raise UnknownBackendError(spec, backend_names())
    if double:
        from .device import DeviceBackend

        try:
            cls = load_backend_class(name)
        except BackendUnavailableError:
            return name, double  # building it says why (make_backend)
        if not issubclass(cls, DeviceBackend):
            raise CommConfigError(f"{spec!r}: only device backends (nccl, hccl) have a test double, "
                                  f"{name} is not one. Fix: use plain {name!r}.")
    return name, double


def _import_target(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def load_backend_class(name: str) -> type[CommBackend]:
    """The backend class for ``name``: from its entry point, else from a known module on sys.path."""
    entry = _entry_points().get(name)
    if entry is not None:
        return entry.load()
    known = KNOWN_BACKENDS.get(name)
    if known is None:
        raise UnknownBackendError(name, backend_names())
    try:
        return _import_target(known.target)
    except ModuleNotFoundError as error:
        source = _CHECKOUT / known.source_dir if known.source_dir else None
        if source is not None and (source / "pyproject.toml").is_file() and str(source) not in sys.path:
            # A source checkout without the sibling installed: use it in place (tests, doctor).
            sys.path.append(str(source))
            return load_backend_class(name)
        raise BackendUnavailableError(
            backend=name,
            detail=f"distribution {known.distribution} is not installed (no entry point, {error.name} not importable)",
            fix=known.install) from None


def _distribution_version(distribution: str | None) -> str | None:
    if not distribution:
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def probe_backend(name: str) -> BackendStatus:
    """``probe()`` of one backend, never raising: failures become an unavailable status."""
    known = KNOWN_BACKENDS.get(name)
    distribution = known.distribution if known else None
    try:
        cls = load_backend_class(name)
        status = cls.probe()
        distribution = status.distribution or getattr(cls, "distribution", distribution)
    except BackendUnavailableError as error:
        status = BackendStatus(name, False, reason=error.detail, fix=error.fix, distribution=distribution)
    except Exception as error:  # a broken plugin must not break the listing
        status = BackendStatus(name, False, reason=f"loading failed: {type(error).__name__}: {error}",
                               fix="reinstall the distribution that provides it", distribution=distribution)
    version = status.version or _distribution_version(distribution)
    if version is None and "cls" in locals():
        package = sys.modules.get(cls.__module__.split(".")[0])
        source_version = getattr(package, "__version__", None)
        version = f"{source_version} (source checkout)" if source_version else None
    return replace(status, distribution=distribution, version=version)


def probe_backends() -> list[BackendStatus]:
    return [probe_backend(name) for name in backend_names()]


def make_backend(spec: str, **options: Any) -> CommBackend:
    """Instantiate the backend named by ``spec`` (see module docstring) with ``options``."""
    name, double = parse_backend_spec(spec)  # refuses a double of a backend that is not a device's
    cls = load_backend_class(name)
    if not double:
        return cls(**options)
    from .testing.device_double import DoubleDeviceApi

    return cls(api=DoubleDeviceApi(flavour=name), **options)
