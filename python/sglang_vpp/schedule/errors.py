"""User-facing errors of the schedule core.

Every class is a ``ValueError`` so callers that validate input can catch one type. Messages say
where (rank, step), what happened, expected against actual, and how to fix it. Internal
invariants use ``assert`` instead.
"""

from __future__ import annotations

__all__ = ["ScheduleError", "LayoutError", "ChunkingError", "FlatCurveError", "PolicyError", "ParseError", "CostModelError"]


class ScheduleError(ValueError):
    """A schedule is malformed: a missing or duplicated action, a bad dependency, a comm mismatch."""


class LayoutError(ValueError):
    """A layer layout cannot be built: bad rank count, layer count or split."""


class ChunkingError(ValueError):
    """Chunking parameters are invalid (chunk size, dynamic-chunking curve)."""


class FlatCurveError(ChunkingError):
    """A fitted prefill latency curve that does not grow super-linearly (``a <= 0``): dynamic
    chunking has nothing to balance. SGLang serves fixed chunks when its start-up fit fails so."""


class PolicyError(ValueError):
    """An unknown policy name or an option the policy does not support."""


class ParseError(ValueError):
    """Text or JSON that does not parse into actions or schedules."""


class CostModelError(ValueError):
    """A cost model cannot answer: a missing measured key, unusable samples, a bad file."""
