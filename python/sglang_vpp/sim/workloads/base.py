"""``Workload``: the requests a simulation serves and how clients send them."""

from __future__ import annotations

from dataclasses import dataclass

from ...schedule import ChunkingError, RequestSpec, check_concurrency, check_num_requests
from ..errors import WorkloadError

__all__ = ["Workload", "check_concurrency", "check_workload_requests"]


def check_workload_requests(num_requests: int, fix: str = "") -> None:
    """``--requests`` of a workload (``check_num_requests``), refused as a ``WorkloadError``."""
    try:
        check_num_requests(num_requests, "--requests", fix)
    except ChunkingError as error:
        raise WorkloadError(str(error)) from None


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
        check_concurrency(self.concurrency, f"workload {self.name!r}: concurrency", error=WorkloadError)

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.requests)

    @property
    def max_length(self) -> int:
        return max(r.length for r in self.requests)
