"""Errors of the VPP mode inside SGLang.

User errors (a flag combination or a model the fold-back layout cannot serve) are ``ValueError``
subclasses whose message names the value and the fix. Runtime failures of the pipeline (a peer
that stops answering, replicated schedulers that disagree) are ``RuntimeError`` subclasses that
name the rank, the peer, the group and what was awaited: they end the server, never fall back
to stock pipeline parallelism.
"""

from __future__ import annotations

__all__ = ["VppConfigError", "CommTimeoutError", "SchedulerDivergenceError"]


class VppConfigError(ValueError):
    """``--pp-mode vpp*`` cannot run with these arguments or this model."""


class CommTimeoutError(RuntimeError):
    """A distributed wait of the VPP loop exceeded its timeout."""

    def __init__(self, *, rank: int, peer: int, group: str, action: str, timeout_s: float) -> None:
        self.rank, self.peer, self.group, self.action, self.timeout_s = rank, peer, group, action, timeout_s
        super().__init__(
            f"VPP rank {rank}: no message from rank {peer} on group '{group}' within {timeout_s:.0f} s "
            f"while waiting for {action}. The peer crashed, hangs, or one stage takes longer than the "
            f"timeout: check the peer's log; for very long chunks raise SGLANG_VPP_COMM_TIMEOUT_S."
        )


class SchedulerDivergenceError(RuntimeError):
    """A follower's replicated scheduler made a different decision than rank 0's."""
