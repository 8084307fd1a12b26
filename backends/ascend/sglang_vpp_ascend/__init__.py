"""sglang-vpp-ascend: the HCCL backend of sglang-vpp's pipeline communicator (Ascend NPUs).

Registered under the ``sglang_vpp.comm_backends`` entry point ``hccl``. Importing this package
does not import torch_npu; ``HcclBackend`` imports it when first used and reports why it cannot
run (``HcclBackend.probe()``, ``sglang-vpp doctor``).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
