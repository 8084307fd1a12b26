"""``FittedCostModel``: ``f(c, L) = a c (c + L) + b (c + L) + d`` fitted on measured actions.

Data flow: ``CostSample``\\ s (``samples.py``, written by the reference runtime) -> ``fit_cost_model`` ->
per-stage coefficients (and per-layer ones when samples carry layer counts, so a fit made on one
layout answers for another) -> ``stage_cost``. Transfers fit ``t = alpha + beta c``.

``a`` carries attention (query-key pairs, ``schedule.causal_pairs``, here c (c + L) as measured
kernels do not exploit the causal half exactly), ``b`` everything linear in the tokens touched,
``d`` the fixed per-chunk cost; the fit's columns are ``fit_features``, read off the prediction.
The fit is least squares on *relative* residuals (small and large chunks weigh the same) with all
three coefficients kept >= 0.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

import numpy as np

from ...schedule.errors import CostModelError
from ...schedule.fitted_cost import Coefficients, FittedCostModel, TransferFit, fit_features
from .samples import CostSample

__all__ = ["fit_coefficients", "fit_cost_model", "fit_transfer_line"]


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
    features = np.array([fit_features(s.parts) for s in samples], dtype=float)
    y = np.array([s.duration_s / (s.num_layers if per_layer else 1) for s in samples], dtype=float)
    a, b, d = _nnls_relative(features, y)
    predicted = features @ np.array([a, b, d])
    rel = (predicted - y) / np.maximum(y, 1e-12)
    layers = {s.num_layers for s in samples}
    return Coefficients(float(a), float(b), float(d), len(samples), float(np.sqrt(np.mean(rel**2))),
                        None if per_layer or len(layers) != 1 else next(iter(layers)))


def fit_transfer_line(tokens: Sequence[int], seconds: Sequence[float]) -> TransferFit:
    """``t = alpha + beta c`` through measured hand-offs (``tokens[i]`` took ``seconds[i]``), both
    coefficients kept >= 0. One message size has no intercept to fit: ``beta`` is then the mean
    seconds per token. No hand-offs: a line of zeros. The fitted profile's transfer line and the
    equal-cost replay's line through its per-size minima (``runtime/equal_cost.py``) are this one."""
    if len(tokens) == 0:
        return TransferFit(0.0, 0.0, 0)
    c = np.array(tokens, dtype=float)
    y = np.array(seconds, dtype=float)
    if len(set(c.tolist())) < 2:
        return TransferFit(0.0, float(np.mean(y / c)), len(c))
    beta, alpha = np.polyfit(c, y, 1)
    return TransferFit(max(0.0, float(alpha)), max(0.0, float(beta)), len(c))


def fit_cost_model(samples: Iterable[CostSample], meta: dict | None = None) -> FittedCostModel:
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
    transfers = [s for s in samples if s.kind == "transfer"]
    transfer = fit_transfer_line([s.num_tokens for s in transfers], [s.duration_s for s in transfers]) if transfers else None
    return FittedCostModel(stages, per_layer, transfer, dict(meta or {}))
