"""``CudaApi``: the real ``DeviceApi`` for NVIDIA GPUs (torch.cuda + ProcessGroupNCCL).

Imported only when the nccl backend is used: constructing ``CudaApi`` checks that torch was built
with CUDA and sees a GPU, and raises ``BackendUnavailableError`` saying which one is missing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ContextManager

import torch
import torch.distributed as dist

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


class CudaApi:
    """``DeviceApi`` over torch.cuda and c10d NCCL."""

    flavour = "nccl"
    device_type = "cuda"
    is_double = False

    def __init__(self) -> None:
        missing = cuda_unavailable_reason()
        if missing is not None:
            raise BackendUnavailableError(backend="nccl", detail=missing[0], fix=missing[1])

    def versions(self) -> dict[str, str]:
        out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # NCCL version query is optional information
            pass
        return out

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def device_names(self) -> list[str]:
        return [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(self.device_count())]

    def set_device(self, index: int) -> torch.device:
        # NCCL's batch_isend_irecv hangs if the current device is not set (torch documents this).
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def new_stream(self) -> Any:
        return torch.cuda.Stream()

    def new_event(self) -> Any:
        return torch.cuda.Event()

    def stream(self, stream: Any) -> ContextManager[Any]:
        return torch.cuda.stream(stream)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def make_pg_options(self) -> Any:
        return dist.ProcessGroupNCCL.Options()

    def new_group(self, ranks: list[int], timeout: timedelta, pg_options: Any, group_desc: str) -> Any:
        return dist.new_group(ranks, timeout=timeout, backend="nccl", pg_options=pg_options, group_desc=group_desc)

    def communicator_name(self, group: Any, rank: int) -> str:
        if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
            return "non-member"
        backend = group._get_backend(torch.device("cuda"))
        parts = [f"nccl:{group.group_name}", f"uid={getattr(backend, 'uid', '?')}"]
        comm_ptr = getattr(backend, "_comm_ptr", None)
        if callable(comm_ptr):
            try:
                parts.append(f"comm=0x{comm_ptr():x}")
            except Exception:  # not initialised yet: the uid alone identifies the backend object
                pass
        return ":".join(parts)

    def p2p_op(self, kind: str, tensor: torch.Tensor, peer: int, group: Any) -> Any:
        return dist.P2POp(dist.isend if kind == "isend" else dist.irecv, tensor, peer, group)

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        return dist.batch_isend_irecv(ops)

    def abort_group(self, group: Any) -> None:
        try:
            group._get_backend(torch.device("cuda")).abort()
        except Exception:  # best effort: the communicator may already be gone
            pass

    def destroy_group(self, group: Any) -> None:
        try:
            dist.destroy_process_group(group)
        except Exception:  # already destroyed with the world
            pass
