"""``CudaApi``: the real ``DeviceApi`` for NVIDIA GPUs (torch.cuda + ProcessGroupNCCL).

Imported only when the nccl backend is used: constructing ``CudaApi`` checks that torch was built
with CUDA and sees a GPU, and raises ``BackendUnavailableError`` saying which one is missing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sglang_vpp.comm.device_api import C10dDeviceApi
from sglang_vpp.comm.errors import BackendUnavailableError

__all__ = ["CudaApi", "cuda_unavailable_reason"]


def cuda_unavailable_reason() -> tuple[str, str] | None:
    """(reason, fix) when NCCL cannot run in this process, else None. Never raises."""
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)",
                "install a CUDA build of torch on a machine with NVIDIA GPUs")
    if not dist.is_available() or not dist.is_nccl_available():
        return (f"torch {torch.__version__} was built without NCCL", "install a torch build with NCCL")
    try:
        if not torch.cuda.is_available():
            return ("torch.cuda.is_available() is False (no GPU visible or driver missing)",
                    "check nvidia-smi and CUDA_VISIBLE_DEVICES")
    except Exception as error:  # a broken driver raises here
        return (f"CUDA initialisation failed: {error}", "check the NVIDIA driver")
    return None


class CudaApi(C10dDeviceApi):
    """``DeviceApi`` over torch.cuda and c10d NCCL."""

    flavour = "nccl"
    device_type = "cuda"

    def __init__(self) -> None:
        missing = cuda_unavailable_reason()
        if missing is not None:
            raise BackendUnavailableError(backend="nccl", detail=missing[0], fix=missing[1])
        super().__init__(torch.cuda)

    def versions(self) -> dict[str, str]:
        out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # NCCL version query is optional information
            pass
        return out

    def make_pg_options(self) -> Any:
        return dist.ProcessGroupNCCL.Options()

    def communicator_name(self, group: Any, rank: int) -> str:
        if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
            return "non-member"
        backend = self.device_backend(group)
        parts = [f"nccl:{group.group_name}", f"uid={getattr(backend, 'uid', '?')}"]
        comm_ptr = getattr(backend, "_comm_ptr", None)
        if callable(comm_ptr):
            try:
                parts.append(f"comm=0x{comm_ptr():x}")
            except Exception:  # not initialised yet: the uid alone identifies the backend object
                pass
        return ":".join(parts)
