"""The simulator: the schedule core's event engine on hardware cost models, with the accounting.

Data flow: workload (``workloads``) -> ``Planner`` (``sglang_vpp.schedule``, with a cost model as
its estimate) -> ``simulate_live`` (``engine``: ``schedule.Engine`` plus the accounting,
durations from a ``StageCostModel``: ``cost``), or given streams -> ``simulate_schedule`` ->
``SimResult`` -> metrics, tables, ``trace``.
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
