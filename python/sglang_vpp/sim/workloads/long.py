"""``long``: one request at a time (closed loop, concurrency 1), e.g. one 512K prompt."""

from __future__ import annotations

from typing import Sequence

from ...schedule import RequestSpec
from ..errors import WorkloadError
from .base import Workload, check_workload_requests

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_LENGTH", "DEFAULT_NUM_REQUESTS", "long_workload"]

DEFAULT_NUM_REQUESTS = 1
"""Requests of each length when ``--requests`` is not given."""
DEFAULT_CONCURRENCY = 1
"""Closed-loop clients when ``--concurrency`` is not given: one prompt at a time."""
DEFAULT_LENGTH = 128 * 1024
"""The prompt length ``simulate`` runs when ``--seq-len`` is not given (docs/cli.md)."""


def long_workload(lengths: Sequence[int], num_requests: int = DEFAULT_NUM_REQUESTS,
                  concurrency: int = DEFAULT_CONCURRENCY) -> Workload:
    """``num_requests`` requests of each length in ``lengths``, sent one after another."""
    check_workload_requests(num_requests)
    if not lengths or min(lengths) < 1:
        raise WorkloadError(f"long workload needs lengths >= 1 token, got {list(lengths)}")
    requests = tuple(RequestSpec(int(n)) for n in lengths for _ in range(num_requests))
    return Workload("long", requests, concurrency,
                    f"{num_requests} x {list(lengths)} tokens, concurrency {concurrency}")
