"""Public entry point for cost models: ``from sglang_vpp.sim.cost_model import ...``.

The classes live one per module in ``sim/cost/``; this module gathers them.
"""

from .cost.base import BreakdownCostModel, StageTime, stage_time
from ..schedule.fitted_cost import Coefficients, FittedCostModel, TransferFit
from .cost.fitted import fit_coefficients, fit_cost_model
from .cost.samples import CostSample, read_samples, samples_from_json, samples_to_json, write_samples
from .cost.table import TableCostModel

__all__ = [
    "BreakdownCostModel", "StageTime", "stage_time", "Coefficients", "FittedCostModel", "TransferFit",
    "fit_coefficients", "fit_cost_model", "CostSample", "read_samples", "write_samples", "samples_to_json",
    "samples_from_json", "TableCostModel",
]
