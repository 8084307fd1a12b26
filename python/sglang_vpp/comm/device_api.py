"""``DeviceApi``: the slice of a device's torch extension that the NCCL and HCCL backends use.

The backends in ``backends/cuda`` and ``backends/ascend`` talk to the hardware only through this
protocol. Three implementations exist:

- ``sglang_vpp_cuda.cuda_api.CudaApi``: ``torch.cuda`` streams and events, ``ProcessGroupNCCL``;
- ``sglang_vpp_ascend.npu_api.NpuApi``: ``torch.npu`` (torch_npu) streams and events,
  ``ProcessGroupHCCL`` with ``hccl_config`` options;
  (both on ``C10dDeviceApi``, the part they share);
- ``sglang_vpp.comm.testing.device_double.DoubleDeviceApi``: a stand-in for the hardware on top
  of gloo that enforces the documented device semantics (strict in-order pairing per
  communicator, a send holds its stream until the receive is posted, sticky stream errors), so
  that the backends' own code (group options, communicator names, streams, events, batched
  exchange) runs and is tested on a CPU-only machine.

Streams and events follow ``torch.cuda`` semantics: ``stream.wait_event(e)``, ``event.record(s)``,
``event.query()`` (non-blocking, True once all work before the record finished; raises the
device's asynchronous error), ``event.synchronize()``. Works from ``batch_isend_irecv`` follow
c10d device semantics: ``work.wait()`` makes the *current stream* wait; it does not block the host.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ContextManager, Protocol, runtime_checkable

import torch

__all__ = ["DeviceApi", "C10dDeviceApi"]


@runtime_checkable
class DeviceApi(Protocol):
    flavour: str
    """c10d backend this API drives: ``"nccl"`` or ``"hccl"``."""

    device_type: str
    """torch device type of the tensors: ``"cuda"``, ``"npu"`` (``"cpu"`` for the double)."""

    def versions(self) -> dict[str, str]:
        """Versions worth reporting (torch, NCCL, torch_npu, CANN, driver)."""
        ...

    def device_count(self) -> int: ...

    def device_names(self) -> list[str]: ...

    def set_device(self, index: int) -> torch.device:
        """Make ``index`` this process's current device; return it."""
        ...

    def new_stream(self) -> Any: ...

    def new_event(self) -> Any: ...

    def stream(self, stream: Any) -> ContextManager[Any]:
        """Context manager making ``stream`` current in this thread."""
        ...

    def current_stream(self) -> Any: ...

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell the caching allocator that ``tensor`` is used on ``stream``."""
        ...

    # Optional: ``wait_event(event, timeout_s) -> bool``, a host wait with a timeout that raises the
    # device's error. Device links use it when present and poll ``event.query()`` otherwise.

    def make_pg_options(self) -> Any:
        """A fresh ``ProcessGroupNCCL.Options`` / ``ProcessGroupHCCL.Options``."""
        ...

    def new_group(self, ranks: list[int], timeout: timedelta, pg_options: Any, group_desc: str) -> Any:
        """``torch.distributed.new_group(ranks, timeout=..., backend=flavour, pg_options=...)``;
        collective over the whole world."""
        ...

    def communicator_name(self, group: Any, rank: int) -> str:
        """Name or address of the device communicator behind ``group`` (may initialise it)."""
        ...

    def p2p_op(self, kind: str, tensor: torch.Tensor, peer: int, group: Any) -> Any:
        """A ``P2POp`` for ``kind`` in {"isend", "irecv"} with global rank ``peer``."""
        ...

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        """Issue ``ops`` as one batched call on the current stream; return their works."""
        ...

    def abort_group(self, group: Any) -> None:
        """Abort a communicator whose operation timed out (best effort, never raises)."""
        ...

    def destroy_group(self, group: Any) -> None:
        """Release the group (never raises)."""
        ...


class C10dDeviceApi:
    """The parts of ``DeviceApi`` that real devices share: torch_npu mirrors ``torch.cuda``, and
    both drive c10d point-to-point the same way. Subclasses check availability, then pass their
    device module (``torch.cuda``, ``torch.npu``) and add options, names and versions."""

    flavour: str
    device_type: str
    is_double = False

    def __init__(self, module: Any) -> None:
        self._module = module

    def device_count(self) -> int:
        return int(self._module.device_count())

    def device_names(self) -> list[str]:
        return [f"{self.device_type}:{i} {self._module.get_device_name(i)}" for i in range(self.device_count())]

    def set_device(self, index: int) -> torch.device:
        # NCCL's batch_isend_irecv hangs if the current device is not set (torch documents this).
        self._module.set_device(index)
        return torch.device(self.device_type, index)

    def new_stream(self) -> Any:
        return self._module.Stream()

    def new_event(self) -> Any:
        return self._module.Event()

    def stream(self, stream: Any) -> ContextManager[Any]:
        return self._module.stream(stream)

    def current_stream(self) -> Any:
        return self._module.current_stream()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def new_group(self, ranks: list[int], timeout: timedelta, pg_options: Any, group_desc: str) -> Any:
        import torch.distributed as dist

        return dist.new_group(ranks, timeout=timeout, backend=self.flavour, pg_options=pg_options,
                              group_desc=group_desc)

    def device_backend(self, group: Any) -> Any:
        """The c10d backend object (ProcessGroupNCCL / ProcessGroupHCCL) behind ``group``."""
        return group._get_backend(torch.device(self.device_type))

    def p2p_op(self, kind: str, tensor: torch.Tensor, peer: int, group: Any) -> Any:
        import torch.distributed as dist

        return dist.P2POp(dist.isend if kind == "isend" else dist.irecv, tensor, peer, group)

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        import torch.distributed as dist

        # NCCL groups the calls (ncclGroupStart/End); torch_npu maps them to HcclBatchSendRecv.
        return dist.batch_isend_irecv(ops)

    def abort_group(self, group: Any) -> None:
        try:
            self.device_backend(group).abort()
        except Exception:  # best effort: the communicator may already be gone
            pass

    def destroy_group(self, group: Any) -> None:
        import torch.distributed as dist

        try:
            dist.destroy_process_group(group)
        except Exception:  # already destroyed with the world
            pass
