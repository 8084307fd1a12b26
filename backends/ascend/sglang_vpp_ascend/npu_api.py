"""``NpuApi``: the real ``DeviceApi`` for Ascend NPUs (torch_npu + ProcessGroupHCCL).

torch_npu is imported here only, when the hccl backend is first used. torch_npu mirrors the CUDA
stream API (``torch.npu.Stream``, ``torch.npu.Event``, ``torch.npu.stream``,
``torch.npu.current_stream``). HCCL group options are
``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options`` with an ``hccl_config`` dict
(``group_name`` at most 32 characters, ``hccl_buffer_size`` in MB); the property returns a copy,
so the whole dict is assigned at once.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
import torch.distributed as dist

from sglang_vpp.comm.device_api import C10dDeviceApi
from sglang_vpp.comm.errors import BackendUnavailableError

__all__ = ["NpuApi", "npu_unavailable_reason"]


def npu_unavailable_reason() -> tuple[str, str] | None:
    """(reason, fix) when HCCL cannot run in this process, else None. Never raises."""
    if importlib.util.find_spec("torch_npu") is None:
        return ("torch_npu is not installed",
                f"install the torch_npu build matching torch {torch.__version__} and your CANN toolkit "
                "(Ascend's instructions), then pip install -e backends/ascend")
    try:
        importlib.import_module("torch_npu")
    except Exception as error:  # e.g. CANN libraries missing: ImportError or OSError
        return (f"import torch_npu failed: {type(error).__name__}: {error}",
                "source the CANN set_env.sh and check that torch_npu matches torch")
    try:
        if not torch.npu.is_available():  # type: ignore[attr-defined]
            return ("torch.npu.is_available() is False (no NPU visible or driver missing)",
                    "check npu-smi info and ASCEND_RT_VISIBLE_DEVICES")
    except Exception as error:
        return (f"NPU initialisation failed: {error}", "check the Ascend driver and CANN")
    return None


class NpuApi(C10dDeviceApi):
    """``DeviceApi`` over torch_npu and ProcessGroupHCCL."""

    flavour = "hccl"
    device_type = "npu"

    def __init__(self) -> None:
        missing = npu_unavailable_reason()
        if missing is not None:
            raise BackendUnavailableError(backend="hccl", detail=missing[0], fix=missing[1])
        self._torch_npu = importlib.import_module("torch_npu")
        super().__init__(torch.npu)  # type: ignore[attr-defined]

    def versions(self) -> dict[str, str]:
        out = {"torch": torch.__version__, "torch_npu": str(getattr(self._torch_npu, "__version__", "?"))}
        get_cann_version = getattr(getattr(self._torch_npu, "npu", None), "get_cann_version", None)
        if callable(get_cann_version):
            try:
                out["cann"] = str(get_cann_version())
            except Exception:  # optional information
                pass
        return out

    def make_pg_options(self) -> Any:
        return self._torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()

    def communicator_name(self, group: Any, rank: int) -> str:
        if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
            return "non-member"
        # get_hccl_comm_name takes the global rank and initialises the communicator if needed.
        return str(self.device_backend(group).get_hccl_comm_name(rank))
