"""Errors of the VPP mode inside SGLang.

User errors (a flag combination or a model the fold-back layout cannot serve) are ``ValueError``
subclasses whose message names the value and the fix. Runtime failures of the pipeline (a peer
that stops answering, replicated schedulers that disagree) are ``RuntimeError`` subclasses that
name the rank, the peer, the group and what was awaited: they end the server, never fall back
to stock pipeline parallelism. A wait that times out raises the communication layer's
``CommTimeoutError`` (``sglang_vpp.comm``), re-exported here.
"""

from __future__ import annotations

from sglang_vpp.comm import CommTimeoutError  # the one timeout error of every pipeline wait

__all__ = ["VppConfigError", "CommTimeoutError", "SchedulerDivergenceError"]


class VppConfigError(ValueError):
    """``--pp-mode vpp*`` cannot run with these arguments or this model."""


class SchedulerDivergenceError(RuntimeError):
    """A follower's replicated scheduler made a different decision than rank 0's."""
