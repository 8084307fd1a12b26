"""``FittedCostModel``: ``f(c, L) = a c (c + L) + b (c + L) + d`` fitted on measured actions.

Data flow: ``CostSample``\\ s (``samples.py``, written by the reference runtime) -> ``fit`` ->
per-stage coefficients (and per-layer ones when samples carry layer counts, so a fit made on one
layout answers for another) -> ``stage_cost``. Transfers fit ``t = alpha + beta c``.

``a`` carries attention (query-key pairs ~ c (L + c/2), here c (c + L) as measured kernels do not
exploit the causal half exactly), ``b`` everything linear in the tokens touched, ``d`` the fixed
per-chunk cost. The fit is least squares on *relative* residuals (small and large chunks weigh
the same) with all three coefficients kept >= 0.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ...schedule import ChunkSpec, StageCostModel, StageSpec
from ..errors import CostModelError
from .samples import CostSample

__all__ = ["Coefficients", "TransferFit", "FittedCostModel", "fit_coefficients", "FITTED_FORMAT"]

FITTED_FORMAT = "sglang-vpp.fitted-cost"


@dataclass(frozen=True, slots=True)
class Coefficients:
    """``f(c, L) = a c (c + L) + b (c + L) + d`` seconds; fit quality alongside."""

    a: float
    b: float
    d: float
    num_samples: int = 0
    rel_rmse: float = 0.0
    """Root mean square of relative residuals on the fitted samples."""
    num_layers: int | None = None
    """Layers of the stage the fit was made on (None for per-layer fits or unknown)."""

    def __call__(self, tokens: int, prefix: int) -> float:
        context = tokens + prefix
        return self.a * tokens * context + self.b * context + self.d

    def scaled(self, factor: float) -> "Coefficients":
        return Coefficients(self.a * factor, self.b * factor, self.d * factor, self.num_samples,
                            self.rel_rmse, None)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "d": self.d, "num_samples": self.num_samples,
                "rel_rmse": self.rel_rmse, "layers": self.num_layers}

    @staticmethod
    def from_dict(data: dict) -> "Coefficients":
        return Coefficients(float(data["a"]), float(data["b"]), float(data["d"]),
                            int(data.get("num_samples", 0)), float(data.get("rel_rmse", 0.0)), data.get("layers"))


@dataclass(frozen=True, slots=True)
class TransferFit:
    """``t = alpha + beta c`` seconds for a hand-off of a c-token chunk."""

    alpha: float
    beta: float
    num_samples: int = 0

    def __call__(self, tokens: int) -> float:
        return self.alpha + self.beta * tokens


def _nnls_relative(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on relative residuals with non-negative coefficients (exhaustive active set:
    at most 3 unknowns, so trying every support is exact and cheap)."""
    weights = 1.0 / np.maximum(y, 1e-12)
    scaled = features * weights[:, None]
    target = np.ones_like(y)
    # Normalize columns for conditioning (c (c + L) reaches 1e12).
    norms = np.linalg.norm(scaled, axis=0)
    norms[norms == 0] = 1.0
    scaled = scaled / norms
    best, best_err = np.zeros(features.shape[1]), float("inf")
    columns = range(features.shape[1])
    for size in range(1, features.shape[1] + 1):
        for support in itertools.combinations(columns, size):
            sub = scaled[:, support]
            solution, *_ = np.linalg.lstsq(sub, target, rcond=None)
            if np.any(solution < 0):
                continue
            err = float(np.sum((sub @ solution - target) ** 2))
            if err < best_err:
                best_err = err
                best = np.zeros(features.shape[1])
                best[list(support)] = solution
    return best / norms


def fit_coefficients(samples: Sequence[CostSample], per_layer: bool = False) -> Coefficients:
    """Fit ``f(c, L)`` on compute samples (durations divided by layers if ``per_layer``)."""
    if len(samples) < 3:
        raise CostModelError(f"need >= 3 compute samples to fit f(c, L), got {len(samples)}: "
                             "measure more chunks (different prefixes and sizes)")
    if per_layer and any(s.num_layers in (None, 0) for s in samples):
        raise CostModelError("a per-layer fit needs 'layers' in every sample")
    c = np.array([s.num_tokens for s in samples], dtype=float)
    context = c + np.array([s.prefix_tokens for s in samples], dtype=float)
    y = np.array([s.duration_s / (s.num_layers if per_layer else 1) for s in samples], dtype=float)
    features = np.stack([c * context, context, np.ones_like(c)], axis=1)
    a, b, d = _nnls_relative(features, y)
    predicted = features @ np.array([a, b, d])
    rel = (predicted - y) / np.maximum(y, 1e-12)
    layers = {s.num_layers for s in samples}
    return Coefficients(float(a), float(b), float(d), len(samples), float(np.sqrt(np.mean(rel**2))),
                        None if per_layer or len(layers) != 1 else next(iter(layers)))


def _fit_transfer(samples: Sequence[CostSample]) -> TransferFit | None:
    if not samples:
        return None
    c = np.array([s.num_tokens for s in samples], dtype=float)
    y = np.array([s.duration_s for s in samples], dtype=float)
    if len(set(c.tolist())) < 2:
        return TransferFit(0.0, float(np.mean(y / c)), len(samples))
    beta, alpha = np.polyfit(c, y, 1)
    return TransferFit(max(0.0, float(alpha)), max(0.0, float(beta)), len(samples))


@dataclass(frozen=True)
class FittedCostModel(StageCostModel):
    """Per-stage fitted costs; see the module docstring.

    Lookup for a stage: its own fit when one exists for that stage index and (if known) the same
    layer count; otherwise the per-layer fit times the stage's layers; otherwise an error that
    says which stage is missing.
    """

    stages: dict[int, Coefficients] = field(default_factory=dict)
    per_layer: Coefficients | None = None
    transfer: TransferFit | None = None
    meta: dict = field(default_factory=dict)

    def _coefficients(self, stage: StageSpec) -> Coefficients:
        own = self.stages.get(stage.stage_index)
        if own is not None and own.num_layers in (None, stage.num_layers):
            return own
        if self.per_layer is not None:
            return self.per_layer.scaled(stage.num_layers)
        raise CostModelError(
            f"no fitted cost for stage {stage.stage_index} ({stage.num_layers} layers); fitted stages: "
            f"{sorted(self.stages)}; record samples with 'layers' to get a per-layer fit, or simulate the "
            "measured layout")

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        coefficients = self._coefficients(stage)
        # A batched forward: the per-forward constant once, the token terms per request.
        return coefficients.d + sum(coefficients(part.num_tokens, part.start) - coefficients.d
                                    for part in chunk.parts)

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.transfer(chunk.total_tokens) if self.transfer is not None else 0.0

    @classmethod
    def fit(cls, samples: Iterable[CostSample], meta: dict | None = None) -> "FittedCostModel":
        """Fit every stage with >= 3 compute samples, a per-layer fit when all samples carry layer
        counts, and the transfer line."""
        samples = list(samples)
        compute = [s for s in samples if s.kind == "compute"]
        if not compute:
            raise CostModelError("no compute samples to fit; the file holds only transfers or nothing")
        by_stage: dict[int, list[CostSample]] = {}
        for sample in compute:
            by_stage.setdefault(sample.stage_index, []).append(sample)
        stages = {s: fit_coefficients(group) for s, group in sorted(by_stage.items()) if len(group) >= 3}
        per_layer = None
        if all(s.num_layers for s in compute) and len(compute) >= 3:
            per_layer = fit_coefficients(compute, per_layer=True)
        if not stages and per_layer is None:
            raise CostModelError(f"every stage has fewer than 3 compute samples ({ {k: len(v) for k, v in by_stage.items()} }); "
                                 "measure more chunks")
        transfer = _fit_transfer([s for s in samples if s.kind == "transfer"])
        return cls(stages, per_layer, transfer, dict(meta or {}))

    def to_json(self) -> dict:
        return {
            "format": FITTED_FORMAT, "version": 1, "meta": self.meta,
            "stages": {str(k): v.to_dict() for k, v in sorted(self.stages.items())},
            "per_layer": self.per_layer.to_dict() if self.per_layer else None,
            "transfer": None if self.transfer is None else
            {"alpha": self.transfer.alpha, "beta": self.transfer.beta, "num_samples": self.transfer.num_samples},
        }

    @classmethod
    def from_json(cls, data: dict) -> "FittedCostModel":
        if data.get("format") != FITTED_FORMAT:
            raise CostModelError(f"not a fitted cost model: format {data.get('format')!r}, expected {FITTED_FORMAT!r}")
        transfer = data.get("transfer")
        return cls(
            {int(k): Coefficients.from_dict(v) for k, v in data.get("stages", {}).items()},
            Coefficients.from_dict(data["per_layer"]) if data.get("per_layer") else None,
            TransferFit(float(transfer["alpha"]), float(transfer["beta"]), int(transfer.get("num_samples", 0)))
            if transfer else None,
            dict(data.get("meta", {})),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FittedCostModel":
        return cls.from_json(json.loads(Path(path).read_text()))
