"""The NCCL backend: payloads over ProcessGroupNCCL, one group and one stream per direction.

NCCL facts it is built around (docs/comm.md, section 3):
- a send may block until its receive is posted, and two communicators carry no guarantee of
  independent progress unless operations are ordered consistently: every link issues one batch
  per message from its own channel thread, in issue order;
- connections are set up lazily on first use: the communicator's warm-up exchange connects every
  link in one global order before real traffic, and only then is ``_comm_ptr`` compared;
- NCCL refuses two ranks on one GPU: ``prepare`` checks the device count against the ranks on
  this host and says so instead of hanging.

``api`` defaults to the real ``CudaApi`` (imported lazily); tests pass the gloo-based
``DoubleDeviceApi`` so that this code runs without a GPU.
"""

from __future__ import annotations

from typing import Any

from sglang_vpp.comm.base import BackendStatus, LinkSpec
from sglang_vpp.comm.device import DeviceBackend
from sglang_vpp.comm.device_api import DeviceApi

__all__ = ["NcclBackend"]


class NcclBackend(DeviceBackend):
    """NCCL point-to-point for the pipeline communicator."""

    name = "nccl"
    distribution = "sglang-vpp-cuda"
    device_word = "GPU"
    peer_gone_markers = ("remote process exited", "connection closed", "socket")
    timeout_markers = ("timeout", "timed out", "watchdog")

    def __init__(self, api: DeviceApi | None = None, high_priority_stream: bool = True) -> None:
        super().__init__(api)
        self.high_priority_stream = high_priority_stream

    @classmethod
    def probe(cls) -> BackendStatus:
        from .cuda_api import CudaApi, cuda_unavailable_reason

        import torch

        missing = cuda_unavailable_reason()
        if missing is not None:
            return BackendStatus(cls.name, False, reason=missing[0], fix=missing[1],
                                 versions={"torch": torch.__version__, "cuda": str(torch.version.cuda)})
        api = CudaApi()
        status_reason, fix = "", ""
        available = api.device_count() >= 2
        if not available:
            status_reason = f"{api.device_count()} GPU visible; NCCL needs one GPU per rank (2 for the self-test)"
            fix = "run on a machine with 2 or more GPUs"
        return BackendStatus(cls.name, available, reason=status_reason, fix=fix, versions=api.versions(),
                             devices=tuple(api.device_names()))

    def _load_api(self) -> DeviceApi:
        from .cuda_api import CudaApi

        return CudaApi()

    def pg_options(self, spec: LinkSpec) -> Any:
        options = self.api.make_pg_options()
        # A high-priority NCCL stream lets activation transfers overtake queued compute kernels.
        options.is_high_priority_stream = self.high_priority_stream
        return options
