"""The HCCL backend (Ascend 910B/910C, the primary target): payloads over ProcessGroupHCCL.

HCCL facts it is built around (docs/comm.md, section 3; SGLang PRs #30844 and
#38249, where pp=2 on NPU hung with both directions on one group):

- single sends/receives must be issued in strict order and in pairs per communicator;
  ``batch_isend_irecv`` maps to ``HcclBatchSendRecv`` (a send and its receive in one call). Every
  message is one batch, issued from its link's channel thread in issue order; ``exchange`` puts
  both directions in one batch.
- Two groups per neighbour pair, one per direction. Each is created with
  ``ProcessGroupHCCL.Options`` whose ``hccl_config["group_name"]`` is distinct per direction and
  pair (``vpp_fwd_0_1``, ``vpp_bwd_0_1``; at most 32 characters). Registries that reuse a group for
  identical options could otherwise merge the two directions into one communicator; the
  communicator checks after creation that ``get_hccl_comm_name`` differs for the two directions
  and raises ``CommunicatorAliasError`` if not.
- ``HCCL_BUFFSIZE`` (environment, MB) sizes each communicator's buffer: default 200 MB, and each
  communicator reserves twice that. With two groups per neighbour pair, a middle rank holds four
  pipeline communicators (8 x HCCL_BUFFSIZE of device memory). ``hccl_buffer_size_mb`` sets
  ``hccl_config["hccl_buffer_size"]`` for our groups only; size it to the largest activation
  message (tokens per chunk x hidden x dtype bytes, e.g. 8192 x 7168 x 2 = 112 MB).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from sglang_vpp.comm.base import BackendStatus, LinkSpec
from sglang_vpp.comm.device import DeviceBackend
from sglang_vpp.comm.device_api import DeviceApi
from sglang_vpp.comm.errors import CommConfigError

__all__ = ["HcclBackend", "HCCL_MAX_GROUP_NAME", "DEFAULT_HCCL_BUFFSIZE_MB"]

HCCL_MAX_GROUP_NAME = 32
DEFAULT_HCCL_BUFFSIZE_MB = 200


class HcclBackend(DeviceBackend):
    """HCCL point-to-point for the pipeline communicator."""

    name = "hccl"
    distribution = "sglang-vpp-ascend"
    device_word = "NPU"
    peer_gone_markers = ("remote rank exit", "remote process exit", "link down", "connection closed")
    timeout_markers = ("timeout", "timed out", "ei0002")  # EI0002: HCCL's notify-wait timeout code

    def __init__(self, api: DeviceApi | None = None, hccl_buffer_size_mb: int | None = None,
                 name_prefix: str = "vpp") -> None:
        super().__init__(api)
        if hccl_buffer_size_mb is not None and (not isinstance(hccl_buffer_size_mb, int) or hccl_buffer_size_mb < 1):
            raise CommConfigError(f"hccl_buffer_size_mb must be a positive integer (MB), got {hccl_buffer_size_mb!r}. "
                                  "Fix: e.g. 256, or None to keep HCCL_BUFFSIZE.")
        self.hccl_buffer_size_mb = hccl_buffer_size_mb
        self.name_prefix = name_prefix
        self._issued_names: dict[str, LinkSpec] = {}

    @classmethod
    def probe(cls) -> BackendStatus:
        from .npu_api import NpuApi, npu_unavailable_reason

        import torch

        missing = npu_unavailable_reason()
        if missing is not None:
            return BackendStatus(cls.name, False, reason=missing[0], fix=missing[1],
                                 versions={"torch": torch.__version__})
        api = NpuApi()
        versions = dict(api.versions())
        versions["HCCL_BUFFSIZE"] = os.environ.get("HCCL_BUFFSIZE", f"{DEFAULT_HCCL_BUFFSIZE_MB} (default)")
        available = api.device_count() >= 2
        missing = f"{api.device_count()} NPU visible; HCCL needs one NPU per rank"
        return BackendStatus(cls.name, available,
                             reason="" if available else missing,
                             fix="" if available else "run on a machine with 2 or more NPUs",
                             versions=versions, devices=tuple(api.device_names()))

    def _load_api(self) -> DeviceApi:
        from .npu_api import NpuApi

        return NpuApi()

    def group_name_for(self, spec: LinkSpec) -> str:
        """The HCCL communicator name of one direction on one pair: distinct, at most 32 chars."""
        name = f"{self.name_prefix}_{spec.group}_{spec.ranks[0]}_{spec.ranks[1]}"
        if len(name) > HCCL_MAX_GROUP_NAME:
            digest = hashlib.sha1(name.encode()).hexdigest()[:10]
            name = f"{self.name_prefix[:8]}_{digest}_{spec.ranks[0]}_{spec.ranks[1]}"[:HCCL_MAX_GROUP_NAME]
        return name

    def pg_options(self, spec: LinkSpec) -> Any:
        options = self.api.make_pg_options()
        config = dict(options.hccl_config or {})
        name = self.group_name_for(spec)
        # Distinct names are what keeps a registry from merging the two directions of a pair.
        assert self._issued_names.setdefault(name, spec) == spec, (name, spec, self._issued_names[name])
        config["group_name"] = name
        if self.hccl_buffer_size_mb is not None:
            config["hccl_buffer_size"] = self.hccl_buffer_size_mb
        options.hccl_config = config  # assign the whole dict: the property hands out a copy
        return options
