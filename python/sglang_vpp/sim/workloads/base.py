"""``Workload``: the requests a simulation serves and how clients send them."""

from __future__ import annotations

from dataclasses import dataclass

from ...schedule import ChunkingError, RequestSpec, check_num_requests
from ..errors import WorkloadError

__all__ = ["Workload", "check_concurrency", "check_workload_requests"]


def check_workload_requests(num_requests: int, fix: str = "") -> None:
    """``--requests`` of a workload (``check_num_requests``), refused as a ``WorkloadError``."""
    try:
        check_num_requests(num_requests, "--requests", fix)
    except ChunkingError as error:
        raise WorkloadError(str(error)) from None


def check_concurrency(concurrency: int | None, name: str = "concurrency", fix: str = "",
                      error: type[ValueError] = WorkloadError) -> None:
    """Requests in flight at most (closed-loop clients) are None (open loop, or the default) or
    >= 1: the one check of a workload's, of ``simulate --concurrency`` and of ``bench-serve
    --concurrency``. ``name`` names it in the message; ``fix``, when given, follows it; ``error``
    is the caller's type (``bench-serve`` refuses a flag as ``CliInputError``)."""
    if concurrency is not None and concurrency < 1:
        raise error(f"{name} must be >= 1, got {concurrency}" + (f"; {fix}" if fix else ""))


@dataclass(frozen=True)
class Workload:
    """Requests in submission order.

    With ``concurrency`` set, clients are closed-loop: the first ``concurrency`` requests are sent
    at their arrival times and each completion sends the next one (no earlier than its own
    arrival). With ``concurrency=None`` every request is sent at its arrival (open loop).
    """

    name: str
    requests: tuple[RequestSpec, ...]
    concurrency: int | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if not self.requests:
            raise WorkloadError(f"workload {self.name!r} has no requests; give at least one")
        check_concurrency(self.concurrency, f"workload {self.name!r}: concurrency")

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.requests)

    @property
    def max_length(self) -> int:
        return max(r.length for r in self.requests)
