"""The simulator: executes the schedule core's per-rank action streams on a virtual clock.

Data flow: workload (``workloads``) -> ``Planner`` / ``build_schedule`` (``sglang_vpp.schedule``,
with a cost model as its estimate) -> ``Schedule`` -> ``simulate_schedule`` (``engine``, durations
from a ``StageCostModel``: ``cost_model``) -> ``SimResult`` -> metrics, tables, ``trace``.
No torch; matplotlib only inside ``trace.write_gantt_png``.
"""

from .config import SimConfig
from .engine import simulate_schedule
from .entities import RankStats, SliceKind, TimelineSlice
from .errors import CostModelError, PresetError, SimDeadlockError, SimError, WorkloadError
from .result import SimResult

__all__ = [
    "SimConfig", "simulate_schedule", "RankStats", "SliceKind", "TimelineSlice", "SimResult",
    "SimError", "PresetError", "CostModelError", "WorkloadError", "SimDeadlockError",
]
