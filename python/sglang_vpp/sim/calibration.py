"""Calibration of the analytic cost model against a measured TTFT breakdown.

Data flow: a ``CalibrationTarget`` (the method doc's table: DeepSeek-V3.1, 512K tokens, TP8 x PP2 on
Ascend 910C, 24K chunks, CPP and DCPP rows of compute / bubble / exposed comm / total) ->
``evaluate`` (plans both modes with the real planner and simulates them with an
``AnalyticCostModel``) -> ``errors`` -> ``fit_hardware`` (Nelder-Mead on the hardware preset's
fitted fields, in log space, each clamped to its physical range from ``priors.PRIORS``, plus a
penalty when the DCPP-vs-CPP trend across lengths is wrong) -> a ``HardwareSpec`` whose numbers
go into ``presets/hardware/<name>.json``. ``at_bounds`` names the fields that ended on a bound;
``sensitivity`` moves each field across its range and reports how every row moves.

``python -m sglang_vpp.sim.calibration`` re-runs the fit and prints the JSON fields to paste;
docs/calibration.md describes how to recalibrate from a profile instead.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .cost.analytic import AnalyticCostModel
from .hardware_spec import HardwareSpec
from .model_spec import ModelSpec
from .preset_loader import load_hardware, load_model
from .priors import PRIORS
from .runner import RunConfig, run_mode
from .workloads import long_workload

__all__ = ["CalibrationTarget", "METHOD_DOC_TABLE", "evaluate", "errors", "trend", "fit_hardware",
           "FITTED_FIELDS", "ASSUMED_FIELDS", "nelder_mead", "at_bounds", "sensitivity"]

ROWS = ("compute_s", "bubble_s", "exposed_comm_s", "total_s")


@dataclass(frozen=True)
class CalibrationTarget:
    model: str
    hardware: str
    num_ranks: int
    seq_len: int
    chunk_size: int
    rows: dict
    """mode -> {compute_s, bubble_s, exposed_comm_s, total_s} (seconds, per-rank profiler view)."""
    trend_lengths: tuple[int, ...] = ()
    trend_ranges: tuple[tuple[float, float], ...] = ()
    """Per trend length: the measured range of DCPP TTFT / CPP TTFT - 1."""
    trend_chunk_sizes: tuple[int, ...] = ()
    note: str = ""


METHOD_DOC_TABLE = CalibrationTarget(
    model="deepseek-v3.1", hardware="ascend-910c", num_ranks=2, seq_len=512 * 1024, chunk_size=24 * 1024,
    rows={
        "cpp": {"compute_s": 252.59, "bubble_s": 38.64, "exposed_comm_s": 16.67, "total_s": 307.90},
        "dcpp": {"compute_s": 279.07, "bubble_s": 20.47, "exposed_comm_s": 22.68, "total_s": 322.22},
    },
    trend_lengths=(64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024),
    trend_ranges=((-0.036, -0.016), (-0.036, -0.016), (-0.036, -0.016), (0.03, 0.06)),
    trend_chunk_sizes=(8 * 1024, 16 * 1024, 24 * 1024, 32 * 1024),
    note="docs/vpp-method.md s2: DCPP ahead of CPP by 1.6-3.6% at 64K-256K, behind at 512K (+4.6% TTFT)",
)

FITTED_FIELDS = ("attention_efficiency", "linear_efficiency", "half_efficiency_tokens", "tp_exposed_fraction",
                 "tp_latency_s")
ASSUMED_FIELDS = ("chunk_overhead_s", "revisit_overhead_s")
"""Fields with a physical range that the target cannot pin down (moving one across its whole range
moves every row by a few seconds at most), so they are set from their source, not fitted: a fit
would push them to whichever bound patches a mechanism the model lacks."""
_BOUNDS = {name: (r.low, r.high) for name, r in PRIORS.items()}


def _run(model: ModelSpec, hardware: HardwareSpec, mode: str, seq_len: int, chunk_size: int, num_ranks: int):
    cost = AnalyticCostModel(model, hardware)
    return run_mode(mode, long_workload([seq_len]), cost, RunConfig(num_ranks, chunk_size), model.num_layers).sim


def evaluate(model: ModelSpec, hardware: HardwareSpec, target: CalibrationTarget = METHOD_DOC_TABLE) -> dict:
    """Simulated rows for the target's modes: mode -> {compute_s, bubble_s, exposed_comm_s, total_s, steps}."""
    out = {}
    for mode in target.rows:
        sim = _run(model, hardware, mode, target.seq_len, target.chunk_size, target.num_ranks)
        out[mode] = {"compute_s": sim.compute_s, "bubble_s": sim.bubble_s, "exposed_comm_s": sim.exposed_comm_s,
                     "total_s": sim.makespan_s, "steps": sim.steps, "num_chunks": sim.num_chunks}
    return out


def errors(simulated: dict, target: CalibrationTarget = METHOD_DOC_TABLE) -> dict:
    """(mode, row) -> relative error (simulated / measured - 1)."""
    return {(mode, row): simulated[mode][row] / target.rows[mode][row] - 1.0
            for mode in target.rows for row in ROWS}


def trend(model: ModelSpec, hardware: HardwareSpec, lengths: Sequence[int], chunk_sizes: Sequence[int],
          num_ranks: int = 2) -> dict[int, float]:
    """Per length: DCPP TTFT / CPP TTFT - 1 (negative: DCPP faster), each mode at its best chunk
    size among ``chunk_sizes`` (as the paper reports each policy at its best budget)."""
    out = {}
    for length in lengths:
        best = {mode: min(_run(model, hardware, mode, length, size, num_ranks).makespan_s for size in chunk_sizes)
                for mode in ("cpp", "dcpp")}
        out[length] = best["dcpp"] / best["cpp"] - 1.0
    return out


def nelder_mead(fn: Callable[[list[float]], float], start: list[float], step: float = 0.3,
                iterations: int = 400, tolerance: float = 1e-7) -> tuple[list[float], float]:
    """Minimise ``fn`` from ``start`` (a plain Nelder-Mead; no scipy dependency)."""
    n = len(start)
    simplex = [list(start)] + [[x + (step if i == j else 0.0) for j, x in enumerate(start)] for i in range(n)]
    values = [fn(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) < tolerance:
            break
        centroid = [sum(p[i] for p in simplex[:-1]) / n for i in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = fn(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = fn(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = fn(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)] for p in simplex[1:]]
                values = [values[0]] + [fn(p) for p in simplex[1:]]
    best = min(range(n + 1), key=values.__getitem__)
    return simplex[best], values[best]


@dataclass
class FitReport:
    hardware: HardwareSpec
    loss: float
    rows: dict
    errors: dict
    trend: dict = field(default_factory=dict)


def fit_hardware(model: ModelSpec, hardware: HardwareSpec, target: CalibrationTarget = METHOD_DOC_TABLE,
                 fields: Sequence[str] = FITTED_FIELDS, iterations: int = 300, trend_weight: float = 1.0) -> FitReport:
    """Fit ``fields`` of ``hardware`` so the simulated rows match ``target`` (see module doc)."""

    def build(point: list[float]) -> HardwareSpec:
        values = {}
        for name, x in zip(fields, point):
            low, high = _BOUNDS[name]
            values[name] = min(high, max(low, math.exp(x)))
        return dataclasses.replace(hardware, **values)

    def loss(point: list[float]) -> float:
        hw = build(point)
        errs = errors(evaluate(model, hw, target), target)
        value = sum(e * e for e in errs.values())
        if trend_weight and target.trend_lengths:
            deltas = trend(model, hw, target.trend_lengths[:-1], target.trend_chunk_sizes, target.num_ranks)
            for (low, high), delta in zip(target.trend_ranges, deltas.values()):
                value += trend_weight * (max(0.0, low - delta) + max(0.0, delta - high)) ** 2 * 100
        return value

    start = [math.log(max(_BOUNDS[f][0], getattr(hardware, f) or _BOUNDS[f][0])) for f in fields]
    point, value = nelder_mead(loss, start, iterations=iterations)
    fitted = build(point)
    rows = evaluate(model, fitted, target)
    report = FitReport(fitted, value, rows, errors(rows, target))
    if target.trend_lengths:
        report.trend = trend(model, fitted, target.trend_lengths, target.trend_chunk_sizes, target.num_ranks)
    return report


def at_bounds(hardware: HardwareSpec, fields: Sequence[str] = FITTED_FIELDS) -> dict[str, str]:
    """Field -> ``"low"`` / ``"high"`` for each fitted field that sits on a bound of its range."""
    out = {}
    for name in fields:
        side = PRIORS[name].at_bound(getattr(hardware, name))
        if side:
            out[name] = side
    return out


def sensitivity(model: ModelSpec, hardware: HardwareSpec, target: CalibrationTarget = METHOD_DOC_TABLE,
                fields: Sequence[str] = FITTED_FIELDS) -> dict[str, dict[str, dict]]:
    """Field -> ``{"low": rows, "high": rows}``: the simulated rows with that field moved to each
    end of its physical range and every other field as in ``hardware``."""
    out = {}
    for name in fields:
        prior = PRIORS[name]
        out[name] = {side: evaluate(model, _with_field_at(hardware, name, value), target)
                     for side, value in (("low", prior.low), ("high", prior.high))}
    return out


def _with_field_at(hardware: HardwareSpec, name: str, value: float) -> HardwareSpec:
    """``hardware`` with ``name`` at ``value``, the revisit kept at most a whole iteration."""
    changes = {name: value}
    if name == "chunk_overhead_s":
        changes["revisit_overhead_s"] = min(hardware.revisit_overhead_s, value)
    elif name == "revisit_overhead_s":
        changes[name] = min(value, hardware.chunk_overhead_s)
    return dataclasses.replace(hardware, **changes)


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - a maintenance tool
    """Re-fit the method doc's table and print the fitted fields as preset JSON."""
    args = list(sys.argv[1:] if argv is None else argv)
    iterations = int(args[0]) if args else 300
    target = METHOD_DOC_TABLE
    report = fit_hardware(load_model(target.model), load_hardware(target.hardware), target, iterations=iterations)
    fitted = {name: getattr(report.hardware, name) for name in FITTED_FIELDS}
    sys.stdout.write(json.dumps({"fitted": fitted, "at_bounds": at_bounds(report.hardware), "loss": report.loss,
                                 "errors": {f"{m}.{r}": e for (m, r), e in report.errors.items()},
                                 "rows": report.rows, "trend": report.trend}, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
