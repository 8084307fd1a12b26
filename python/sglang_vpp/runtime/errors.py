"""Errors of the reference runtime.

User input errors (a bad model path, a layout the model cannot take, an unknown mode or preset)
are ``ValueError`` subclasses: the CLI turns them into ``error: ...`` and exit code 2. Failures
of a run (a rank that crashed, a peer that went silent) are ``RuntimeError`` subclasses: they
name every rank's state, so the cause is visible from any one message.
"""

from __future__ import annotations

__all__ = ["ModelConfigError", "ModelPathError", "RankFailedError", "RunConfigError", "RunTimeoutError"]


class ModelConfigError(ValueError):
    """A model description the runtime cannot build (unknown architecture, bad sizes, preset)."""


class ModelPathError(ModelConfigError):
    """``--model PATH`` does not point at a readable Hugging Face model directory."""


class RunConfigError(ValueError):
    """Run options that cannot work together (more stages than layers, bad chunk size, device)."""


class RankFailedError(RuntimeError):
    """One or more ranks failed; the message lists each rank's exit status and error."""

    def __init__(self, message: str, rank_errors: dict[int, str]) -> None:
        super().__init__(message)
        self.rank_errors = rank_errors


class RunTimeoutError(RankFailedError):
    """The run did not finish within its deadline; every rank was stopped."""
