"""``JitteredCostModel``: stage times that depart from a cost model at random (a what-if).

Each stage compute of each chunk takes the base model's time (every component of its
breakdown) times ``max(0.05, 1 + spread * z)``, ``z`` standard normal, drawn once per
(seed, stage or rank, request, chunk): the same work has the same duration wherever it is asked for,
so a dry run and a simulation on these durations agree. Transfers are not jittered. The spread is an
assumption to explore (``simulate --jitter``), not a fitted property of any hardware.

Whether a real device's variation is drawn per forward or shared by a rank's whole share of a
micro-batch is not known either. Per stage (the default), a fold-back rank's two stages of a
chunk draw apart, so its time per micro-batch varies by about 1/sqrt(2) of a contiguous rank's,
which holds the same layers in one stage; ``per_rank`` gives a chunk's stages on one rank one
draw, so both layouts vary alike per rank. The draw is keyed by the stage index or the rank
number: a contiguous layout, whose stage i is rank i, draws the same either way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ...schedule import ChunkSpec, StageCostModel, StageSpec
from ..errors import SimError
from .base import BreakdownCostModel, StageTime, stage_time

__all__ = ["JitteredCostModel", "check_jitter"]

_FLOOR = 0.05
"""Smallest factor: a draw far in the left tail must not make a stage free or negative."""


def check_jitter(spread: float, flag: str = "--jitter") -> None:
    """A jitter spread lies in [0, 1] (NaN is refused): the one check of ``simulate --jitter``, the
    simulator's ``RunConfig`` and ``JitteredCostModel``. ``flag`` names it in the message."""
    if not 0.0 <= spread <= 1.0:
        raise SimError(f"{flag} must lie in [0, 1] (a relative spread: 0.03 = 3%), got {spread}")


@dataclass(frozen=True)
class JitteredCostModel(BreakdownCostModel):
    base: StageCostModel
    spread: float
    """Relative standard deviation of a stage's time (0.03: 3 %)."""
    seed: int = 0
    per_rank: bool = False
    """A chunk's stages on one rank share one draw (module docstring); False: each stage draws its own."""

    def __post_init__(self) -> None:
        check_jitter(self.spread)

    def factor(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        if self.spread == 0.0:
            return 1.0
        where = stage.rank if self.per_rank else stage.stage_index
        rng = random.Random(f"{self.seed}:{where}:{chunk.request_index}:{chunk.chunk_index}")
        return max(_FLOOR, 1.0 + self.spread * rng.gauss(0.0, 1.0))

    def stage_breakdown(self, stage: StageSpec, chunk: ChunkSpec) -> StageTime:
        parts = stage_time(self.base, stage, chunk)
        k = self.factor(stage, chunk)
        return StageTime(parts.compute_s * k, parts.tp_comm_s * k, parts.overhead_s * k)

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.base.transfer_cost(stage, chunk)
