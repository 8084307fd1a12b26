"""Make a CUDA-built torchvision importable next to a CPU-only torch (runs at ``import torch``).

Job: on a CPU-only torch, PyPI's torchvision (a CUDA build) cannot load its ``_C`` extension,
and ``import torchvision`` then fails on two unguarded fake-kernel registrations for the
operators ``torchvision::nms`` and ``torchvision::qnms`` (torchvision/_meta_registrations.py).
SGLang imports ``torchvision.transforms`` while loading its model configs, in the launcher and
in every scheduler process, before any SGLang plugin runs.

Data flow: ``import torch`` -> entry point group ``torch.backends`` (PyTorch's documented
out-of-tree extension autoload; disable with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) ->
``autoload()`` -> if torchvision is installed, torch has no GPU runtime and torchvision's ``_C``
cannot be loaded, define the two operator *schemas* (no kernels) so that torchvision's
registrations succeed. torchvision still reports ``_has_ops() == False``, so its C++ ops stay
unavailable, exactly as before; only the import works.

[Note: torchvision import shim] This is the only code of the project that runs in processes
that never asked for it (every ``import torch``): it imports nothing heavy, touches nothing
when torchvision's extension loads, and never raises.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
from pathlib import Path

__all__ = ["autoload"]

logger = logging.getLogger(__name__)

# Kept alive for the life of the process: dropping a torch.library.Library removes its defs.
_LIBRARY = None
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _torchvision_extension_loads(package_dir: Path) -> bool:
    candidates = sorted(package_dir.glob("_C*.so")) + sorted(package_dir.glob("_C*.pyd"))
    if not candidates:
        return False
    try:
        ctypes.CDLL(str(candidates[0]))
    except OSError:
        return False
    return True


def _define_missing_torchvision_ops() -> None:
    global _LIBRARY
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or _LIBRARY is not None:
        return
    import torch

    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        return  # a GPU torch loads torchvision's extension itself
    if _torchvision_extension_loads(Path(spec.origin).parent):
        return  # a CPU build of torchvision: nothing to do
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        library.define(schema)
    _LIBRARY = library
    logger.debug("sglang-vpp: defined torchvision nms/qnms schemas (CUDA torchvision on CPU torch)")


def autoload() -> None:
    """Entry point of group ``torch.backends``; never raises (it runs inside ``import torch``)."""
    try:
        _define_missing_torchvision_ops()
    except Exception:  # noqa: BLE001 - see [Note: torchvision import shim]
        logger.debug("sglang-vpp torchvision shim skipped", exc_info=True)
