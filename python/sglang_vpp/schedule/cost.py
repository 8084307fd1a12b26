"""Cost models: how long one virtual stage takes on one chunk, and one hand-off.

One abstract method (``stage_cost``) is shared by everything that needs a duration: the planner
uses a model as its *estimate* when it orders work, the simulator executes schedules with a
(possibly different, richer) model, and the runtime's measured costs are replayed through a
fitted model. Times are seconds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from .ir import ChunkSpec
from .layout import StageSpec

__all__ = ["StageCostModel", "LinearAttentionCost", "attention_work", "causal_pairs"]


def causal_pairs(tokens: int, prefix: int) -> float:
    """(query, key) pairs of causal attention for ``tokens`` new queries after ``prefix`` keys:
    ``c (L + (c + 1) / 2)``, the query at position ``p`` seeing ``p + 1`` keys. The one copy of
    this count: the planner's estimate and the simulator's analytic model read it."""
    return tokens * (prefix + (tokens + 1) / 2)


def attention_work(chunk: ChunkSpec) -> float:
    """``causal_pairs`` of a chunk after its prefix, summed over the requests of a batched
    forward (each attends over its own prefix)."""
    return sum(causal_pairs(part.num_tokens, part.start) for part in chunk.parts)


class StageCostModel(ABC):
    """Duration of stage work and of activation hand-offs."""

    @abstractmethod
    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        """Seconds for ``stage`` to process ``chunk`` (its prefix already in the KV cache)."""

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        """Seconds to move ``stage``'s output for ``chunk`` to the next rank (0 by default)."""
        return 0.0


@dataclass(frozen=True, slots=True)
class LinearAttentionCost(StageCostModel):
    """``layers * (linear * c + attention * attention_work) + fixed`` per stage and forward (a
    batched forward: ``c`` is its total, the attention term a sum over its requests, ``fixed`` once).

    With ``attention`` dominant this is the method's law ``tau_k = (k + 1) t`` for equal chunks.
    The defaults (attention equal to the linear part at a 2K-token prefix) are the planner's
    estimate when no model-specific cost is given; only ratios matter for ordering decisions.
    """

    linear_per_token: float = 1e-6
    attention_per_pair: float = 1e-6 / 2048
    fixed_per_chunk: float = 0.0
    transfer_per_token: float = 0.0

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        per_layer = self.linear_per_token * chunk.total_tokens + self.attention_per_pair * attention_work(chunk)
        return stage.num_layers * per_layer + self.fixed_per_chunk

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.transfer_per_token * chunk.total_tokens
