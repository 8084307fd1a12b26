"""``mixed``: the paper's mixed workload, synthesised and seeded.

500 requests, lengths 7 to 122,710 tokens, mean ~22.5K, median ~10K, p90 ~64K, concurrency 16.
Lengths are log-normal (median 10K; the spread chosen so the p90 lands near 64K), clipped to the
range, with the extremes pinned (one request of 7 tokens and one of 122,710) so the range holds
for every seed. ``describe_lengths`` reports the statistics the paper quotes.
"""

from __future__ import annotations

import math
import random
from statistics import fmean, median

from ...schedule import RequestSpec
from ..errors import WorkloadError
from .base import Workload

__all__ = ["mixed_workload", "mixed_lengths", "describe_lengths", "DEFAULT_CONCURRENCY", "DEFAULT_NUM_REQUESTS", "MIN_LENGTH",
           "MAX_LENGTH"]

DEFAULT_NUM_REQUESTS = 500
"""Requests when ``--requests`` is not given: the paper's mixed workload."""
DEFAULT_CONCURRENCY = 16
"""Closed-loop clients when ``--concurrency`` is not given: the paper's."""

MIN_LENGTH = 7
MAX_LENGTH = 122_710
_MEDIAN = 10_000
_SIGMA = 1.42  # ln(64K / 10K) / z_0.9 = 1.45; slightly less so clipping keeps the mean near 22.5K


def mixed_lengths(num_requests: int = DEFAULT_NUM_REQUESTS, seed: int = 0) -> list[int]:
    if num_requests < 2:
        raise WorkloadError(f"mixed workload needs >= 2 requests (it pins the min and max), got {num_requests}")
    rng = random.Random(seed)
    lengths = [min(MAX_LENGTH, max(MIN_LENGTH, int(rng.lognormvariate(math.log(_MEDIAN), _SIGMA))))
               for _ in range(num_requests)]
    low, high = rng.sample(range(num_requests), 2)
    lengths[low], lengths[high] = MIN_LENGTH, MAX_LENGTH
    return lengths


def describe_lengths(lengths: list[int]) -> dict:
    ordered = sorted(lengths)
    return {"num_requests": len(lengths), "min": ordered[0], "max": ordered[-1], "mean": fmean(ordered),
            "median": median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def mixed_workload(num_requests: int = DEFAULT_NUM_REQUESTS, seed: int = 0,
                   concurrency: int = DEFAULT_CONCURRENCY) -> Workload:
    requests = tuple(RequestSpec(n) for n in mixed_lengths(num_requests, seed))
    return Workload("mixed", requests, concurrency,
                    f"{num_requests} mixed-length requests (seed {seed}), concurrency {concurrency}")
