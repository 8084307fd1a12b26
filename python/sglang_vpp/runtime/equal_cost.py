"""The equal-cost replay: every mode's executed order re-timed on ONE cost model shared by all modes.

Why: each mode's own replay (``replay.replay_run``) times its schedule with its own measured
per-action CPU costs, so two modes differ by their schedules *and* by the noise of two
measurements on a shared host. Timing every mode on the same costs leaves only the schedule:
this is the replay the verdict of ``sglang-vpp bench`` uses.

Cost model (``SharedCostModel``), fitted on the compute samples of all modes together::

    stage call on the chunk at (prefix L, c tokens) with n layers =
        fixed + first * embed + last * head + n * layer(L, c)

``layer(L, c)`` is a table: one layer's cost at that chunk position (for a forward that batches
several prompts, at that tuple of (prefix, tokens) parts: four 1K prompts are not one 4K chunk). ``fixed`` is what one stage
call costs whatever its layers (dispatch, the hand-off's tensor bookkeeping); ``embed`` / ``head``
what only the first / last stage runs. Contiguous (cpp, dcpp) and fold-back (vpp*) layouts run
the same chunk positions with different layers per stage, which is what separates ``fixed`` from
the per-layer part; all unknowns come from one least-squares solve on relative residuals
(``fixed``, ``embed``, ``head`` kept >= 0). Positions only one layout ran (dcpp's chunks) get
their per-layer cost from their own samples, given the shared fixed terms.

Least disturbed: for every (layers, first, last, parts) shape each mode contributes its
*minimum* over its repeats (a neighbour process on the same cores stretches thread CPU time --
shared caches, memory bandwidth -- but never shortens it), and the solve sees the median of those
per-mode minima. Every mode's estimate rests on the same number of samples: a minimum over all
samples would be lower for shapes that more modes ran (the three fold-back modes share theirs)
and favour those modes.

Transfers: per message size the least-contended measured hand-off over all modes; sizes only one
mode produced (dcpp's chunks) use a line through those minima.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..schedule import ChunkSpec, Layout, Schedule, StageCostModel, StageSpec
from ..schedule.fitted_cost import TransferFit
from ..sim import SimConfig, SimResult, simulate_schedule
from ..sim.cost.fitted import fit_transfer_line
from ..sim.cost.samples import CostSample

__all__ = ["EQUAL_COST_LABEL", "MeasuredRunCosts", "SharedCostModel", "equal_cost_replay"]

EQUAL_COST_LABEL = "replayed on one cost model shared by all modes (least-disturbed costs of every mode)"

_FIXED_TERMS = ("fixed", "embed", "head")
Shape = tuple[tuple[int, int], ...]
"""(prefix tokens, chunk tokens) of every request in one forward, the lead first: one chunk
position, or a batched forward's parts (four 1K prompts in one forward are not one 4K chunk)."""


@dataclass(frozen=True)
class MeasuredRunCosts:
    """What one run contributes: its mode, its layout (to tell first and last stages), its samples."""

    mode: str
    layout: Layout
    samples: Sequence[CostSample]


@dataclass(frozen=True)
class SharedCostModel:
    """See the module docstring. Whether a stage is first or last depends on the layout:
    ``for_layout`` gives the simulator's cost model for one layout."""

    fixed: tuple[float, float, float]
    """``fixed``, ``embed``, ``head`` seconds (``_FIXED_TERMS``)."""
    per_layer: dict[Shape, float]
    transfer_by_tokens: dict[int, float]
    transfer_line: TransferFit
    """Asked for message sizes no mode measured (``fit_transfer_line`` through the per-size minima)."""
    num_shapes: int
    rel_rmse: float
    """Root mean square of the relative residuals over the fitted shapes."""
    fallback: SharedCostModel | None = None
    """Asked for chunk positions this model's samples do not hold."""

    def compute(self, num_layers: int, first: bool, last: bool, shape: Shape) -> float:
        layer = self.per_layer.get(shape)
        if layer is None and self.fallback is not None:
            return self.fallback.compute(num_layers, first, last, shape)
        if layer is None:
            raise KeyError(f"no measured forward of (prefix, tokens) parts {list(shape)}: the shared model only "
                           "replays chunk positions some mode of the same repeat ran")
        return self.fixed[0] + first * self.fixed[1] + last * self.fixed[2] + num_layers * layer

    def for_layout(self, layout: Layout) -> StageCostModel:
        return _LayoutCost(self, layout)

    def transfer(self, tokens: int) -> float:
        known = self.transfer_by_tokens.get(tokens)
        if known is not None:
            return known
        return self.transfer_line(tokens)

    def to_dict(self) -> dict:
        return {"fixed_s": dict(zip(_FIXED_TERMS, self.fixed)), "chunk_positions": len(self.per_layer),
                "shapes": self.num_shapes, "rel_rmse": self.rel_rmse,
                "transfer": {"alpha_s": self.transfer_line.alpha, "beta_s_per_token": self.transfer_line.beta,
                             "sizes": len(self.transfer_by_tokens)}}

    @classmethod
    def fit(cls, runs: Sequence[MeasuredRunCosts], fallback: SharedCostModel | None = None) -> SharedCostModel:
        per_mode: dict[tuple[int, bool, bool, Shape], dict[str, float]] = {}
        transfers: dict[int, float] = {}
        for run in runs:
            last_stage = run.layout.num_stages - 1
            for s in run.samples:
                if s.kind == "transfer":
                    transfers[s.num_tokens] = min(s.duration_s, transfers.get(s.num_tokens, float("inf")))
                    continue
                assert s.num_layers is not None, s
                key = (s.num_layers, s.stage_index == 0, s.stage_index == last_stage, s.parts)
                minima = per_mode.setdefault(key, {})
                minima[run.mode] = min(s.duration_s, minima.get(run.mode, float("inf")))
        assert per_mode, "no compute samples to fit"
        least = {key: statistics.median(minima.values()) for key, minima in per_mode.items()}
        shapes = sorted({shape for (_, _, _, shape) in least})
        column = {shape: len(_FIXED_TERMS) + i for i, shape in enumerate(shapes)}
        features = np.zeros((len(least), len(_FIXED_TERMS) + len(shapes)))
        for row, (layers, first, last, shape) in enumerate(least):
            features[row, :3] = (1.0, float(first), float(last))
            features[row, column[shape]] = layers
        y = np.array(list(least.values()), dtype=float)
        solution = _fixed_terms_nonnegative_fit(features, y)
        rel = (features @ solution - y) / np.maximum(y, 1e-12)
        per_layer = {shape: max(0.0, float(solution[column[shape]])) for shape in shapes}
        return cls((float(solution[0]), float(solution[1]), float(solution[2])), per_layer, transfers,
                   fit_transfer_line(list(transfers), list(transfers.values())), len(least), float(np.sqrt(np.mean(rel**2))), fallback)


@dataclass(frozen=True)
class _LayoutCost(StageCostModel):
    shared: SharedCostModel
    layout: Layout

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        first, last = stage.stage_index == 0, stage.stage_index == self.layout.num_stages - 1
        parts = tuple((part.start, part.num_tokens) for part in chunk.parts)
        return self.shared.compute(stage.num_layers, first, last, parts)

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.shared.transfer(chunk.total_tokens)


def _fixed_terms_nonnegative_fit(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative residuals (cheap and expensive chunks weigh the same); a fixed
    term that comes out negative is dropped and the rest solved again (per-layer costs are
    positive by construction of the data; only the shared terms can trade off)."""
    scaled = features / np.maximum(y, 1e-12)[:, None]
    active = list(range(features.shape[1]))
    while True:
        part, *_ = np.linalg.lstsq(scaled[:, active], np.ones_like(y), rcond=None)
        negative = [i for i, value in zip(active, part) if i < len(_FIXED_TERMS) and value < 0]
        if not negative:
            solution = np.zeros(features.shape[1])
            solution[active] = part
            return solution
        worst = min(negative, key=lambda i: part[active.index(i)])
        active.remove(worst)


def equal_cost_replay(schedule: Schedule, model: SharedCostModel, arrivals: dict[int, float]) -> SimResult:
    """One mode's executed ``schedule`` timed on the shared ``model``."""
    return simulate_schedule(schedule, model.for_layout(schedule.layout), SimConfig(raise_on_deadlock=True),
                             arrivals=arrivals)
