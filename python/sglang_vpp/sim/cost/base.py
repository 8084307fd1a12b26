"""What the simulator's cost models add to ``StageCostModel``: a breakdown of a stage's time.

``StageCostModel.stage_cost`` answers "how long"; the simulator also wants to know how much of
that is math, how much is tensor-parallel communication that could not be hidden, and how much is
host overhead during which the device idles. ``BreakdownCostModel`` adds ``stage_breakdown``;
``stage_cost`` is its total, so the planner (which only knows ``stage_cost``) and the simulator
agree on durations. Models that only implement ``stage_cost`` (e.g. the schedule core's
``LinearAttentionCost``) count as pure compute.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

from ...schedule import ChunkSpec, StageCostModel, StageSpec

__all__ = ["StageTime", "BreakdownCostModel", "stage_time"]


@dataclass(frozen=True, slots=True)
class StageTime:
    """Seconds one stage spends on one chunk, split by what the device is doing."""

    compute_s: float
    """Math and memory traffic of the stage's layers."""
    tp_comm_s: float = 0.0
    """Exposed tensor-parallel collectives (the part not overlapped with math)."""
    overhead_s: float = 0.0
    """Host-side fixed cost per chunk (scheduling, launches) while the device idles."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.overhead_s


class BreakdownCostModel(StageCostModel):
    """A ``StageCostModel`` that can split a stage's time; ``stage_cost`` is the total."""

    @abstractmethod
    def stage_breakdown(self, stage: StageSpec, chunk: ChunkSpec) -> StageTime:
        """Time of ``stage`` on ``chunk`` by component."""

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.stage_breakdown(stage, chunk).total_s


def stage_time(cost: StageCostModel, stage: StageSpec, chunk: ChunkSpec) -> StageTime:
    """Breakdown from any cost model (pure compute when it cannot split)."""
    breakdown = getattr(cost, "stage_breakdown", None)
    if breakdown is not None:
        return breakdown(stage, chunk)
    return StageTime(cost.stage_cost(stage, chunk))
