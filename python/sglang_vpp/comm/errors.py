"""Errors of the communication layer.

Two families:

- ``CommConfigError`` and its subclasses are ``ValueError``: the caller passed something wrong
  (an unknown backend, a group that was not created, a value that cannot travel in a tensor
  dict). The message names the value and the fix.
- ``CommError`` and its subclasses are ``RuntimeError``: something went wrong on the wire. Each
  one carries the local ``rank``, the ``peer`` rank, the ``group`` name and the ``action`` label
  (the schedule's text form, e.g. ``0SEND_F1.0>1@fwd``, when the runtime passes it), so a log line
  says which operation of which rank with whom failed. ``CommTimeoutError`` adds the timeout.

``CommError`` values pickle (the launcher sends them from rank processes to the parent), which
plain exceptions with keyword-only constructors do not; ``__reduce__`` takes care of it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CommConfigError",
    "UnknownBackendError",
    "TensorDictError",
    "CommError",
    "CommTimeoutError",
    "PeerDeadError",
    "CommProtocolError",
    "CommClosedError",
    "CommunicatorAliasError",
    "BackendUnavailableError",
    "DeviceSemanticsError",
]


class CommConfigError(ValueError):
    """User input to the communication layer is invalid; the message says the value and the fix."""


class UnknownBackendError(CommConfigError):
    """A backend name that no entry point and no known distribution provides."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(
            f"unknown communication backend {name!r}; valid names: {', '.join(self.known)} "
            "(append '@double' to nccl or hccl for the gloo-based device test double). "
            "Fix: pass one of these, or install the distribution that registers the backend "
            "under the 'sglang_vpp.comm_backends' entry-point group."
        )


class TensorDictError(CommConfigError):
    """A tensor dict holds something that cannot be sent (bad key, dtype or metadata value)."""


class CommError(RuntimeError):
    """A communication operation failed. Carries where (rank, peer, group) and what (action)."""

    #: Short description of the failure class, used to build the message.
    what = "communication failed"

    def __init__(
        self,
        *,
        rank: int | None = None,
        peer: int | None = None,
        group: str | None = None,
        action: str | None = None,
        detail: str = "",
        fix: str = "",
        **extra: Any,
    ) -> None:
        self.rank = rank
        self.peer = peer
        self.group = group
        self.action = action
        self.detail = detail
        self.fix = fix
        self.extra = extra
        super().__init__(self._format())

    def _where(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.action:
            parts.append(f"action {self.action}")
        if self.group is not None:
            parts.append(f"group '{self.group}'")
        if self.peer is not None:
            parts.append(f"peer rank {self.peer}")
        return ", ".join(parts) if parts else "communicator"

    def _format(self) -> str:
        text = f"{self._where()}: {self.what}"
        if self.detail:
            text += f": {self.detail}"
        if self.fix:
            text += f". Fix: {self.fix}"
        return text

    def context(self) -> dict[str, Any]:
        """The structured fields, for logs and for tests that assert on them."""
        return {"rank": self.rank, "peer": self.peer, "group": self.group, "action": self.action,
                "detail": self.detail, **self.extra}

    def with_action(self, action: str, detail_prefix: str = "", rank: int | None = None) -> "CommError":
        """The same failure reported for another operation (a later op on a broken channel);
        ``rank``: and by that rank (a failure classified before its rank was known)."""
        state = self._state()
        state["action"] = action
        if rank is not None:
            state["rank"] = rank
        if detail_prefix:
            state["detail"] = f"{detail_prefix}{state['detail']}"
        return type(self)(**state)

    def _state(self) -> dict[str, Any]:
        return {"rank": self.rank, "peer": self.peer, "group": self.group, "action": self.action,
                "detail": self.detail, "fix": self.fix, **self.extra}

    def __reduce__(self):  # keyword-only constructor: rebuild from the state dict
        return (_rebuild, (type(self), self._state()))


def _rebuild(cls: type, state: dict[str, Any]) -> CommError:
    return cls(**state)


class CommTimeoutError(CommError, TimeoutError):
    """An operation did not complete within its timeout: the peer is stuck or the pattern deadlocks."""

    what = "timed out"

    def __init__(self, *, timeout_s: float | None = None, **kwargs: Any) -> None:
        self.timeout_s = timeout_s
        super().__init__(timeout_s=timeout_s, **kwargs)

    def _format(self) -> str:
        text = f"{self._where()}: timed out after {self.timeout_s:.2f}s" if self.timeout_s is not None \
            else f"{self._where()}: timed out"
        if self.detail:
            text += f": {self.detail}"
        fix = self.fix or (
            "check that the peer posts the matching operation on the same group in the same order "
            "(per communicator, operations pair in issue order), that opposite directions use "
            "separate groups, and that the timeout covers the peer's compute time"
        )
        return f"{text}. Fix: {fix}"


class PeerDeadError(CommError):
    """The peer closed the connection: it exited, crashed, or aborted after its own failure."""

    what = "peer is gone"


class CommProtocolError(CommError):
    """A message arrived out of order or malformed: the two ends disagree about the stream."""

    what = "protocol violation"


class CommClosedError(CommError):
    """The operation was issued on, or still pending at, a closed communicator."""

    what = "communicator closed"


class CommunicatorAliasError(CommError):
    """Two groups that must be distinct communicators resolved to the same one."""

    what = "two directions share one communicator"


class BackendUnavailableError(CommError):
    """The backend cannot run here; ``detail`` says why and ``fix`` what to install or change."""

    what = "backend unavailable"

    def __init__(self, *, backend: str, **kwargs: Any) -> None:
        self.backend = backend
        super().__init__(backend=backend, **kwargs)

    def _where(self) -> str:
        base = super()._where()
        return f"backend '{self.backend}'" if base == "communicator" else f"{base}, backend '{self.backend}'"


class DeviceSemanticsError(CommError):
    """The device test double saw an operation order that real HCCL/NCCL would hang or corrupt on."""

    what = "device point-to-point semantics violated"
