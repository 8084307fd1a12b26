"""The same equality check on a GPU (nccl) or NPU (hccl): skipped here with the reason.

On a device machine: ``pytest tests/runtime/test_device.py -m device``. Each rank uses one device
(NCCL refuses two ranks on one GPU), the reference runs on the same device type with the same
chunk boundaries.
"""

from __future__ import annotations

import pytest
import torch
from sglang_vpp.runtime.launcher import launch
from sglang_vpp.runtime.models import resolve_model
from sglang_vpp.runtime.reference import RequestOutput, max_abs_diff, reference_device, reference_forward
from sglang_vpp.runtime.spec import Device, RequestArrival, RunSpec
from sglang_vpp.schedule import ChunkSpec

pytestmark = [pytest.mark.slow, pytest.mark.device]


def _available(device: Device) -> str | None:
    """None if two ranks can run on ``device`` here, else why not."""
    if device is Device.CUDA:
        if not torch.cuda.is_available():
            return "no CUDA device (torch.cuda.is_available() is False)"
        if torch.cuda.device_count() < 2:
            return f"needs 2 GPUs (one per rank; NCCL refuses two ranks on one GPU), found {torch.cuda.device_count()}"
        return None
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        return "torch_npu is not installed (no Ascend NPU stack)"
    if torch.npu.device_count() < 2:  # type: ignore[attr-defined]
        return "needs 2 NPUs (one per rank)"
    return None


@pytest.mark.parametrize("device", [Device.CUDA, Device.NPU])
@pytest.mark.parametrize("mode,model", [("cpp", "tiny-qwen3"), ("vpp", "tiny-qwen3"), ("vpp-pack", "tiny-qwen3"),
                                        ("vpp-pack", "tiny-qwen3-moe"), ("vpp-pack", "tiny-deepseek")])
def test_device_equals_reference(device, mode, model):
    """Dense and MoE/MLA models: the experts' routing runs on the device too."""
    reason = _available(device)
    if reason is not None:
        pytest.skip(reason)
    spec = RunSpec(model, mode, 2, (RequestArrival(300), RequestArrival(100)), 64, device=device)
    result = launch(spec)
    chunks = [ChunkSpec(*c) for c in result.reports[0].chunks]
    want = reference_forward(resolve_model(model), [300, 100], chunks=chunks, device=reference_device(device)).outputs
    got = [RequestOutput(k, h, l) for k, (h, l) in sorted(result.outputs.items())]
    assert max_abs_diff(got, want) <= 1e-5
