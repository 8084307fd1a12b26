"""``short``: N concurrent requests of one length (the paper: 100 x 4K / 8K / 16K)."""

from __future__ import annotations

from ...schedule import RequestSpec
from ..errors import WorkloadError
from .base import Workload, check_workload_requests

__all__ = ["DEFAULT_NUM_REQUESTS", "short_workload"]

DEFAULT_NUM_REQUESTS = 100
"""Requests when ``--requests`` is not given: the paper's short workloads send 100."""


def short_workload(length: int, num_requests: int = DEFAULT_NUM_REQUESTS, concurrency: int | None = None) -> Workload:
    """``num_requests`` requests of ``length`` tokens, all sent at t = 0 (closed loop with
    ``concurrency`` clients if given, else all at once)."""
    check_workload_requests(num_requests)
    if length < 1:
        raise WorkloadError(f"short workload needs requests of >= 1 token, got {length}")
    requests = tuple(RequestSpec(int(length)) for _ in range(num_requests))
    return Workload("short", requests, concurrency or num_requests,
                    f"{num_requests} concurrent x {length} tokens")
