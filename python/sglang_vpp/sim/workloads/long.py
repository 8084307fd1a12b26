"""``long``: one request at a time (closed loop, concurrency 1), e.g. one 512K prompt."""

from __future__ import annotations

from typing import Sequence

from ...schedule import RequestSpec
from ..errors import WorkloadError
from .base import Workload

__all__ = ["long_workload"]


def long_workload(lengths: Sequence[int], num_requests: int = 1, concurrency: int = 1) -> Workload:
    """``num_requests`` requests of each length in ``lengths``, sent one after another."""
    if num_requests < 1:
        raise WorkloadError(f"--requests must be >= 1, got {num_requests}")
    if not lengths or min(lengths) < 1:
        raise WorkloadError(f"long workload needs lengths >= 1 token, got {list(lengths)}")
    requests = tuple(RequestSpec(int(n)) for n in lengths for _ in range(num_requests))
    return Workload("long", requests, concurrency,
                    f"{num_requests} x {list(lengths)} tokens, concurrency {concurrency}")
