"""sglang-vpp-cuda: the NCCL backend of sglang-vpp's pipeline communicator.

Registered under the ``sglang_vpp.comm_backends`` entry point ``nccl``. Importing this package
imports no CUDA library; ``NcclBackend`` loads ``torch.cuda`` when it is first used and reports
why it cannot run (``NcclBackend.probe()``, ``sglang-vpp doctor``).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
