"""User-facing errors of the simulator.

Every class is a ``ValueError`` (as in ``sglang_vpp.schedule.errors``) so the CLI turns them into
``error: ...`` and exit code 2. Messages name the bad value, what was expected and the fix.
Internal invariants use ``assert``.
"""

from __future__ import annotations

from ..schedule.errors import CostModelError

__all__ = ["SimError", "PresetError", "CostModelError", "WorkloadError", "SimDeadlockError"]


class SimError(ValueError):
    """Bad simulator input: an unknown option value, a schedule the simulator cannot execute."""


class PresetError(SimError):
    """An unknown or malformed model / hardware preset."""


class WorkloadError(SimError):
    """A workload cannot be built: bad lengths, request counts or a malformed JSONL file."""


class SimDeadlockError(SimError):
    """The schedule deadlocks under the simulated semantics; ``report`` is the ``DeadlockReport``."""

    def __init__(self, message: str, report) -> None:
        super().__init__(message)
        self.report = report
