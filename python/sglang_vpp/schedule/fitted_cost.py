"""``FittedCostModel``: ``f(c, L) = a c (c + L) + b (c + L) + d`` per stage, as fitted on
measured actions (the fit itself: ``sim/cost/fitted.py``, which needs numpy).

Pure Python so every executor's controller can decide with a fitted estimate, the SGLang plugin
included (``--vpp-cost-profile``), without importing the simulator.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .. import json_text
from .cost import StageCostModel
from .errors import CostModelError
from .ir import ChunkSpec
from .layout import Layout, StageSpec

__all__ = ["Coefficients", "TransferFit", "FittedCostModel", "FITTED_FORMAT", "fit_features"]

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

    def forward(self, parts: Iterable[tuple[int, int]]) -> float:
        """Seconds for one forward of ``(prefix, tokens)`` parts (``CostSample.parts``): a batched
        forward pays the constant ``d`` once and the token terms per request."""
        return self.d + sum(self(tokens, prefix) - self.d for prefix, tokens in parts)

    def scaled(self, factor: float) -> "Coefficients":
        return Coefficients(self.a * factor, self.b * factor, self.d * factor, self.num_samples,
                            self.rel_rmse, None)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "d": self.d, "num_samples": self.num_samples,
                "rel_rmse": self.rel_rmse, "layers": self.num_layers}

    @staticmethod
    def from_dict(data: dict, where: str) -> "Coefficients":
        """The fit ``where`` (``per_layer``, ``stage 0``) of a cost file; ValueError naming the field."""
        layers = data.get("layers")
        return Coefficients(_finite(data, "a", where), _finite(data, "b", where), _finite(data, "d", where),
                            _whole(data.get("num_samples", 0), f"{where} num_samples", 0),
                            _finite(data, "rel_rmse", where, 0.0),
                            None if layers is None else _whole(layers, f"{where} layers", 1))


_UNIT_COEFFICIENTS = (Coefficients(1.0, 0.0, 0.0), Coefficients(0.0, 1.0, 0.0), Coefficients(0.0, 0.0, 1.0))


def fit_features(parts: Iterable[tuple[int, int]]) -> tuple[float, float, float]:
    """The columns a fit solves ``a``, ``b``, ``d`` on for one forward of ``(prefix, tokens)``
    parts: ``Coefficients.forward`` with one coefficient 1 and the others 0 (it is linear in
    them), so the fit (``sim/cost/fitted.py``) and the prediction read one formula:
    ``(sum c (c + L), sum (c + L), 1)`` over the requests."""
    parts = tuple(parts)
    a, b, d = (unit.forward(parts) for unit in _UNIT_COEFFICIENTS)
    return a, b, d


def _finite(data: dict, key: str, where: str, default: float | None = None) -> float:
    """A number of a cost file: a string or boolean is a file written by hand or by another tool
    (Python reads ``true`` as 1), NaN or infinity would turn every simulated time into one, and
    a negative coefficient (the fit never writes one: ``sim/cost/fitted.py`` fits non-negative
    coefficients) into negative stage times, TTFTs and compute."""
    value = data[key] if default is None else data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        name = key if key == "rel_rmse" else f"coefficient {key}"
        raise ValueError(f"{where} {name} is {value!r}, not a finite number >= 0")
    return float(value)


def _whole(value: object, name: str, low: int) -> int:
    """A count of a cost file (layers, samples): ``int()`` would read 1.5 as 1 and ``true`` as 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} is {value!r}, not a whole number >= {low}")
    return value


@dataclass(frozen=True, slots=True)
class TransferFit:
    """``t = alpha + beta c`` seconds for a hand-off of a c-token chunk."""

    alpha: float
    beta: float
    num_samples: int = 0

    def __call__(self, tokens: int) -> float:
        return self.alpha + self.beta * tokens


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

    def _own(self, stage: StageSpec) -> Coefficients | None:
        own = self.stages.get(stage.stage_index)
        return own if own is not None and own.num_layers in (None, stage.num_layers) else None

    def other_depth(self, num_layers: int) -> str | None:
        """'was measured on M with N layers' when the measured model's depth (``meta``) is not
        ``num_layers``, else None (also when the file does not record it)."""
        measured = self.meta.get("num_layers")
        if measured is None or measured == num_layers:
            return None
        on = f" on {self.meta['model']}" if self.meta.get("model") else ""
        return f"was measured{on} with {measured} layers"

    def check_layout(self, layout: Layout, *, other_depth: bool = False) -> None:
        """CostModelError unless this model answers for every stage of ``layout`` and was measured
        on a model of its depth: another depth is another model, whose per-layer costs are not
        these (``other_depth`` allows it: ``simulate --costs`` scales a per-layer fit to another
        depth as a what-if, and warns). Checked where a profile meets its layout, so a profile
        fitted for another layout is refused before the first estimate."""
        used = (f"used with a model of {layout.num_layers} layers in {layout.num_stages} {layout.kind} stages "
                f"({layout.num_ranks} ranks) of {', '.join(str(s.num_layers) for s in layout.stages)} layers")
        on = f" on {self.meta['model']}" if self.meta.get("model") else ""
        depth = self.other_depth(layout.num_layers)
        if not other_depth and depth is not None:
            raise CostModelError(f"{depth}; {used}; measure this model with sglang-vpp bench --costs FILE")
        if self.per_layer is not None:
            return
        missing = [s.stage_index for s in layout.stages if self._own(s) is None]
        if missing:
            fitted = ", ".join(f"{i} ({c.num_layers} layers)" if c.num_layers else str(i)
                               for i, c in sorted(self.stages.items()))
            raise CostModelError(f"was fitted{on} for stages {fitted} with no per-layer fit; {used}, and stage"
                                 f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                                 f"{'have' if len(missing) > 1 else 'has'} no fit; record samples with 'layers' "
                                 "to get a per-layer fit, or measure this layout")

    def _coefficients(self, stage: StageSpec) -> Coefficients:
        own = self._own(stage)
        if own is not None:
            return own
        if self.per_layer is not None:
            return self.per_layer.scaled(stage.num_layers)
        raise CostModelError(
            f"no fitted cost for stage {stage.stage_index} ({stage.num_layers} layers); fitted stages: "
            f"{sorted(self.stages)}; record samples with 'layers' to get a per-layer fit, or simulate the "
            "measured layout")

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self._coefficients(stage).forward((part.start, part.num_tokens) for part in chunk.parts)

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        return self.transfer(chunk.total_tokens) if self.transfer is not None else 0.0

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
        if not isinstance(data, dict) or data.get("format") != FITTED_FORMAT:
            raise CostModelError(f"not a fitted cost model: format {data.get('format') if isinstance(data, dict) else data!r}, "
                                 f"expected {FITTED_FORMAT!r}")
        if not data.get("stages") and not data.get("per_layer"):
            # The fit never writes one (``sim/cost/fitted.py`` refuses too few samples); without
            # this check such a file would pass the launch check and fail at the first estimate.
            raise CostModelError(f"a {FITTED_FORMAT} file with no fit (no \"stages\", no \"per_layer\"); "
                                 "write it again with sglang-vpp bench --costs FILE")
        transfer = data.get("transfer")
        try:
            meta = dict(data.get("meta", {}))
            if meta.get("num_layers") is not None:  # the measured model's depth (bench writes it)
                _whole(meta["num_layers"], "meta num_layers", 1)
            stages = {}
            for key, fit in data.get("stages", {}).items():
                if not (key.isascii() and key.isdigit()):
                    raise ValueError(f"stage {key!r} is not a stage index (a whole number >= 0)")
                coefficients = stages[int(key)] = Coefficients.from_dict(fit, f"stage {key}")
                if (coefficients.num_layers or 0) > (meta.get("num_layers") or math.inf):
                    raise ValueError(f"stage {key} layers is {coefficients.num_layers}, more than the measured "
                                     f"model's meta num_layers {meta['num_layers']}")
            return cls(
                stages,
                Coefficients.from_dict(data["per_layer"], "per_layer") if data.get("per_layer") else None,
                TransferFit(_finite(transfer, "alpha", "transfer"), _finite(transfer, "beta", "transfer"),
                            _whole(transfer.get("num_samples", 0), "transfer num_samples", 0))
                if transfer else None,
                meta,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as error:  # Overflow: an integer too large for a float
            raise CostModelError(f"a malformed {FITTED_FORMAT} file ({type(error).__name__}: {error}); write it "
                                 "again with sglang-vpp bench --costs FILE") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FittedCostModel":
        return cls.from_json(json_text.loads(Path(path).read_text()))
