"""The reference runtime: real multi-process pipelined chunked prefill with real model layers.

Data flow::

    RunSpec (model, mode, ranks, requests, chunk size)
      -> launcher.RankPool: one process per rank (gloo on CPU; the comm abstraction's backend on
         GPU/NPU), each holding only its layers (models.materialize)
      -> control: a replica of the schedule core's online Planner per rank, driven by rank 0
      -> executor.RankExecutor: each rank's action stream on real layers, KV per (request, stage),
         hand-offs through sglang_vpp.comm, every wait bounded
      -> records -> metrics (measured: compute / exposed comm / idle, TTFT)
                 -> replay (dedicated-hardware timeline through sglang_vpp.sim, cost samples)
      -> reference.reference_forward: the single-process forward every mode must equal
      -> bench.run_bench: all of the above per mode and repeat (``sglang-vpp bench``)

See docs/runtime.md.
"""

from .errors import (
    ModelConfigError,
    ModelPathError,
    RankFailedError,
    RunConfigError,
    RunTimeoutError,
)
from .spec import Device, FaultKind, FaultSpec, RequestArrival, RunSpec, Timeouts

__all__ = [
    "Device",
    "FaultKind",
    "FaultSpec",
    "ModelConfigError",
    "ModelPathError",
    "RankFailedError",
    "RequestArrival",
    "RunConfigError",
    "RunSpec",
    "RunTimeoutError",
    "Timeouts",
]
