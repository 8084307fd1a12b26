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
from datetime import timedelta
from typing import Any, ContextManager

import torch
import torch.distributed as dist

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


class NpuApi:
    """``DeviceApi`` over torch_npu and ProcessGroupHCCL."""

    flavour = "hccl"
    device_type = "npu"
    is_double = False

    def __init__(self) -> None:
        missing = npu_unavailable_reason()
        if missing is not None:
            raise BackendUnavailableError(backend="hccl", detail=missing[0], fix=missing[1])
        self._torch_npu = importlib.import_module("torch_npu")
        self._npu = torch.npu  # type: ignore[attr-defined]

    def versions(self) -> dict[str, str]:
        out = {"torch": torch.__version__, "torch_npu": str(getattr(self._torch_npu, "__version__", "?"))}
        for getter in ("get_cann_version",):
            fn = getattr(self._torch_npu.npu, getter, None) if hasattr(self._torch_npu, "npu") else None
            if callable(fn):
                try:
                    out["cann"] = str(fn())
                except Exception:  # optional information
                    pass
        return out

    def device_count(self) -> int:
        return int(self._npu.device_count())

    def device_names(self) -> list[str]:
        return [f"npu:{i} {self._npu.get_device_name(i)}" for i in range(self.device_count())]

    def set_device(self, index: int) -> torch.device:
        self._npu.set_device(index)
        return torch.device("npu", index)

    def new_stream(self) -> Any:
        return self._npu.Stream()

    def new_event(self) -> Any:
        return self._npu.Event()

    def stream(self, stream: Any) -> ContextManager[Any]:
        return self._npu.stream(stream)

    def current_stream(self) -> Any:
        return self._npu.current_stream()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def make_pg_options(self) -> Any:
        return self._torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()

    def new_group(self, ranks: list[int], timeout: timedelta, pg_options: Any, group_desc: str) -> Any:
        return dist.new_group(ranks, timeout=timeout, backend="hccl", pg_options=pg_options, group_desc=group_desc)

    def communicator_name(self, group: Any, rank: int) -> str:
        if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
            return "non-member"
        # get_hccl_comm_name takes the global rank and initialises the communicator if needed.
        return str(group._get_backend(torch.device("npu")).get_hccl_comm_name(rank))

    def p2p_op(self, kind: str, tensor: torch.Tensor, peer: int, group: Any) -> Any:
        return dist.P2POp(dist.isend if kind == "isend" else dist.irecv, tensor, peer, group)

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        # torch_npu maps this to HcclBatchSendRecv: each send and its receive in one call.
        return dist.batch_isend_irecv(ops)

    def abort_group(self, group: Any) -> None:
        try:
            group._get_backend(torch.device("npu")).abort()
        except Exception:  # best effort
            pass

    def destroy_group(self, group: Any) -> None:
        try:
            dist.destroy_process_group(group)
        except Exception:  # already destroyed with the world
            pass
