"""Pipeline communication: one communicator per rank over gloo, NCCL or HCCL.

Public surface (see docs/comm.md):

- ``create_communicator(backend, CommConfig(...)) -> Communicator`` (a ``PipelineCommunicator``):
  ``isend`` / ``irecv`` / ``exchange`` of tensor dicts returning ``CommHandle``s, ``wait_any``,
  ``send`` / ``recv``, ``close``.
- Errors: ``CommTimeoutError`` and ``PeerDeadError`` (and the other ``CommError``s) name rank,
  peer, group and action; ``CommConfigError`` (a ``ValueError``) for bad input.
- Backends: ``probe_backends()``, ``make_backend(spec)``; entry-point group
  ``sglang_vpp.comm_backends``. ``gloo`` lives here, ``nccl`` in backends/cuda, ``hccl`` in
  backends/ascend.
- ``launcher.run_ranks`` spawns local ranks for tests and the doctor.

Importing this package imports torch but no device library.
"""

from .base import BackendStatus, CommBackend, CommHandle, Link, LinkSpec, OpKind, PipelineCommunicator, TensorDict
from .communicator import Communicator, create_communicator
from .config import COMM_TIMEOUT_S, DEFAULT_GROUPS, SINGLE_GROUP, CommConfig
from .errors import (
    BackendUnavailableError,
    CommClosedError,
    CommConfigError,
    CommError,
    CommProtocolError,
    CommTimeoutError,
    CommunicatorAliasError,
    DeviceSemanticsError,
    PeerDeadError,
    TensorDictError,
    UnknownBackendError,
)
from .registry import ENTRY_POINT_GROUP, backend_names, make_backend, probe_backend, probe_backends

__all__ = [
    "BackendStatus", "CommBackend", "CommHandle", "Link", "LinkSpec", "OpKind", "PipelineCommunicator",
    "TensorDict", "Communicator", "create_communicator", "COMM_TIMEOUT_S", "DEFAULT_GROUPS", "SINGLE_GROUP", "CommConfig",
    "BackendUnavailableError", "CommClosedError", "CommConfigError", "CommError", "CommProtocolError",
    "CommTimeoutError", "CommunicatorAliasError", "DeviceSemanticsError", "PeerDeadError", "TensorDictError",
    "UnknownBackendError", "ENTRY_POINT_GROUP", "backend_names", "make_backend", "probe_backend",
    "probe_backends",
]
