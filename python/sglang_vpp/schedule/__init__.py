"""The schedule core: pure Python, no torch.

Data flow: ``RequestSpec`` -> chunker (``chunking``) -> ``Planner`` (drives the ``Controller``, which
decides admission and order from the ``policies`` with a ``StageCostModel`` estimate, at the times
its executor reports) -> per-rank ``Action`` streams on a ``Layout``, executed as they grow by the
event ``Engine`` (``dry_run``: on the estimate; the simulator: on a hardware model) or the
reference runtime -> ``Schedule`` -> ``validate_schedule`` and ``check_deadlock``. The SGLang
plugin asks the ``Controller`` directly.
"""

from .balance import BALANCE_MODES, balance_split, estimated_makespan
from .chunking import (
    MAX_CHUNKS_PER_REQUEST,
    Chunker,
    DynamicChunker,
    FixedChunker,
    FlatCurveFallback,
    QuadraticCurve,
    TaperedChunker,
    check_chunk_count,
    check_chunk_counts,
    MAX_PLAN_WORK,
    RANKS_PER_EVENT,
    check_plan_work,
    check_chunk_size,
    check_concurrency,
    check_num_requests,
    check_request_count,
    plan_work,
    fit_quadratic,
    parse_size,
    split_request,
)
from .controller import Admission, Controller, ControllerLimits, HandOff, MicroBatch, default_in_flight_limit
from .cost import LinearAttentionCost, StageCostModel, attention_work, causal_pairs
from .deadlock import DeadlockReport, check_deadlock
from .errors import ChunkingError, FlatCurveError, LayoutError, ParseError, PolicyError, ScheduleError
from .ir import (
    GROUP_BACKWARD,
    GROUP_FORWARD,
    GROUP_SINGLE,
    Action,
    ActionKind,
    ChunkSpec,
    RequestSpec,
    compute,
    recv,
    send,
)
from .layout import Fold, Layout, LayoutKind, StageSpec, build_layout, check_num_ranks, even_split, parse_fold, stage_count
from .factory import (
    ControllerConfig,
    build_controller,
    controller_config,
    default_chunker,
    mode_stages,
    plan_stages,
    policy_layout,
    server_controller_config,
)
from .planner import Planner, TimelineEntry
from .policies import FOLDBACK_MODES, POLICIES, CommSemantics, Policy, PolicySpec, Priority, get_policy, parse_policies
from .schedule import Schedule, schedule_from_planner
from .dry_run import DryRun, build_schedule, dry_run
from .engine import Engine
from .text import format_grid, parse_rank_lines, schedule_from_json, schedule_to_json, schedule_to_text
from .validate import ValidationIssue, find_issues, validate_schedule

__all__ = [
    "Admission", "Controller", "ControllerLimits", "HandOff", "MicroBatch", "default_in_flight_limit",
    "BALANCE_MODES", "balance_split", "estimated_makespan", "Chunker", "DynamicChunker", "FixedChunker", "FlatCurveFallback", "QuadraticCurve", "TaperedChunker", "fit_quadratic", "parse_size",
    "split_request", "MAX_CHUNKS_PER_REQUEST", "check_chunk_count", "check_chunk_counts", "MAX_PLAN_WORK", "RANKS_PER_EVENT", "check_plan_work", "check_request_count", "check_chunk_size", "check_concurrency", "check_num_requests", "plan_work", "LinearAttentionCost", "StageCostModel", "attention_work", "causal_pairs", "DeadlockReport",
    "check_deadlock", "ChunkingError", "FlatCurveError", "LayoutError", "ParseError", "PolicyError", "ScheduleError",
    "GROUP_BACKWARD", "GROUP_FORWARD", "GROUP_SINGLE", "Action", "ActionKind", "ChunkSpec",
    "RequestSpec", "compute", "recv", "send", "Layout", "LayoutKind", "StageSpec", "build_layout", "check_num_ranks", "Fold", "parse_fold", "stage_count", "mode_stages", "plan_stages", "policy_layout",
    "even_split", "FOLDBACK_MODES", "Planner", "ControllerConfig", "build_controller", "controller_config",
    "server_controller_config",
    "TimelineEntry", "POLICIES", "CommSemantics", "Policy",
    "PolicySpec", "Priority", "get_policy", "parse_policies", "Schedule", "build_schedule", "DryRun", "dry_run", "Engine",
    "default_chunker", "schedule_from_planner", "format_grid", "parse_rank_lines",
    "schedule_from_json", "schedule_to_json", "schedule_to_text", "ValidationIssue", "find_issues",
    "validate_schedule",
]
