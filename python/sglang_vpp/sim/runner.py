"""Run workloads through the real planner and the engine: one mode, one chunk size.

Data flow: ``Workload`` -> ``plan_workload`` (a ``Planner`` from the schedule core, online: a
closed-loop workload submits the next request from the planner's ``on_complete`` callback at the
completion time on the planner's *estimated* clock; the estimate is the same cost model the
simulation uses) -> ``Schedule`` + client gating (which request's completion sent which request)
-> ``simulate_schedule`` (the engine re-times everything; a gated request starts when its gate
completes *in the simulation*) -> ``ModeResult`` (``SimResult`` + lower bound).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..schedule import (
    DynamicChunker,
    Planner,
    PlannerConfig,
    RequestSpec,
    Schedule,
    StageCostModel,
    build_layout,
    ChunkSpec,
    default_chunker,
    default_in_flight_limit,
    get_policy,
    schedule_from_planner,
)
from ..schedule.auto_size import auto_chunker
from .config import SimConfig
from .engine import simulate_schedule
from .errors import SimError
from .metrics import gap_to_bound, lower_bound
from .result import SimResult
from .workloads import Workload

__all__ = ["RunConfig", "PlannedWorkload", "ModeResult", "plan_workload", "run_mode"]


@dataclass(frozen=True)
class RunConfig:
    """Pipeline shape and planner knobs of one run."""

    num_ranks: int
    """P, the number of pipeline ranks."""
    chunk_size: int
    """Tokens per chunk (the base size for dcpp); with ``auto_chunk`` the largest size allowed."""
    split: tuple[int, ...] | None = None
    """Per-stage layer counts; None splits evenly (remainder to the first stages)."""
    dcpp_smooth_factor: float = 1.0
    """DCPP smoothing toward the base size; the paper's DCPP baseline uses 1.0 (SGLang's default
    is 0.75)."""
    max_in_flight: int | None = None
    """Override the planner's in-flight chunk limit (default: P contiguous, 2P-1 fold-back)."""
    batch_requests: bool = True
    """Batch short requests into one forward up to ``chunk_size`` tokens, as SGLang's prefill adder
    does with its chunked-prefill budget (``Controller.joins_batch``); False: one request per
    forward."""
    sim: SimConfig = field(default_factory=SimConfig)
    auto_chunk: bool = False
    """Let the controller's ``auto`` chunker pick the chunk size and batch budget per situation
    (``schedule/auto_size.py``): the requests sent together, then the ones in flight at each send."""

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise SimError(f"--pp must be >= 1, got {self.num_ranks}")
        if self.chunk_size < 1:
            raise SimError(f"--chunk-size must be >= 1 token, got {self.chunk_size}")


@dataclass
class PlannedWorkload:
    schedule: Schedule
    release_after: dict[int, int]
    """Request j may start only when request ``release_after[j]`` completes (closed loop)."""
    arrivals: dict[int, float]
    """Each request's own arrival time (the planner's copies of gated requests carry estimated
    send times instead)."""
    auto_sizes: tuple[int, ...] = ()
    """With ``auto_chunk``: the size chosen at each decision, in order."""


@dataclass
class ModeResult:
    mode: str
    chunk_size: int
    sim: SimResult
    lower_bound_s: float
    schedule: Schedule | None = None
    auto_sizes: tuple[int, ...] = ()
    """Sizes an ``auto`` run chose, in decision order (empty: a fixed chunk size)."""

    @property
    def gap_to_bound(self) -> float:
        return gap_to_bound(self.sim.makespan_s, self.lower_bound_s)

    def row(self) -> dict:
        """The mode's JSON fields (makespan, idle, TTFT), plus the bound, chunk counts and the per-rank split."""
        s = self.sim
        return {
            "mode": self.mode, "chunk_size": self.chunk_size, "ttft_s": s.ttft_s,
            "throughput_tok_s": s.throughput_tok_s, "makespan_s": s.makespan_s, "compute_s": s.compute_s,
            "bubble_s": s.bubble_s, "exposed_comm_s": s.exposed_comm_s, "bubble_ratio": s.bubble_ratio,
            "idle_by_cause_s": s.idle_by_cause,
            "steps": s.steps, "num_chunks": s.num_chunks, "lower_bound_s": self.lower_bound_s,
            "gap_to_bound": self.gap_to_bound, "num_requests": len(s.request_ttft_s),
            "num_tokens": s.num_tokens, "deadlock": s.deadlock is not None,
            "per_rank": [r.to_dict() for r in s.per_rank],
            **({"auto_chunk_sizes": sorted(set(self.auto_sizes))} if self.auto_sizes else {}),
        }


def _chunker(spec, config: RunConfig, layout, cost: StageCostModel, max_length: int):
    if not spec.dynamic_chunks:
        return default_chunker(spec, config.chunk_size, layout, cost, max_length)
    stage = layout.stages[0]

    def latency(length: int) -> float:
        # SGLang profiles whole prefills of ``length`` tokens on PP rank 0 at start-up.
        return cost.stage_cost(stage, ChunkSpec(0, 0, 0, length))

    return DynamicChunker.from_latency_fn(latency, config.chunk_size, max(max_length, 2 * config.chunk_size),
                                          smooth_factor=config.dcpp_smooth_factor)


def plan_workload(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig,
                  num_layers: int) -> PlannedWorkload:
    """Plan ``workload`` for ``mode`` with the schedule core's online planner (see module doc)."""
    spec = get_policy(mode)
    layout = build_layout(config.num_ranks, num_layers, spec.layout_kind,
                          list(config.split) if config.split else None)
    if config.auto_chunk:
        def at_size(size: int, max_length: int):
            return _chunker(spec, dataclasses.replace(config, chunk_size=size, auto_chunk=False), layout, cost,
                            max_length)

        chunker = auto_chunker(spec, layout, cost, config.chunk_size, max_in_flight=config.max_in_flight,
                               chunker_for=at_size, batch=config.batch_requests)
    else:
        chunker = _chunker(spec, config, layout, cost, workload.max_length)
    pending = list(workload.requests)
    concurrency = workload.concurrency if workload.concurrency is not None else len(pending)
    first, pending = pending[:concurrency], pending[concurrency:]
    arrivals = [r.arrival for r in first]
    gates: list[int | None] = [None] * len(first)
    active = {i: r.length for i, r in enumerate(first)}

    def on_complete(request_index: int, end: float) -> list[RequestSpec]:
        active.pop(request_index, None)
        if not pending:
            return []
        request = pending.pop(0)
        gates.append(request_index)
        arrivals.append(request.arrival)
        active[len(arrivals) - 1] = request.length
        planner.controller.resize(list(active.values()))
        return [RequestSpec(request.length, max(request.arrival, end))]

    budget = config.chunk_size if config.batch_requests else None
    planner = Planner(PlannerConfig(spec, layout, chunker, cost, config.max_in_flight, token_budget=budget),
                      on_complete=on_complete)
    planner.controller.resize([r.length for r in first])
    for request in first:
        planner.submit(request)
    planner.advance()
    schedule = schedule_from_planner(planner)
    assert len(schedule.requests) == len(workload.requests), (len(schedule.requests), len(workload.requests))
    release_after = {j: g for j, g in enumerate(gates) if g is not None}
    sizes = tuple(c.chunk_size for c in getattr(chunker, "history", ()))
    return PlannedWorkload(schedule, release_after, dict(enumerate(arrivals)), sizes)


def run_mode(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig, num_layers: int,
             keep_schedule: bool = False) -> ModeResult:
    """Plan and simulate one mode; the planner's estimate is ``cost`` itself."""
    planned = plan_workload(mode, workload, cost, config, num_layers)
    sim_config = config.sim
    layout = planned.schedule.layout
    if sim_config.max_in_flight is None and layout.stages[-1].rank != layout.stages[0].rank:
        # SGLang's micro-batch slots: the window the controller admitted with.
        sim_config = dataclasses.replace(sim_config, max_in_flight=config.max_in_flight or default_in_flight_limit(layout))
    sim = simulate_schedule(planned.schedule, cost, sim_config, arrivals=planned.arrivals,
                            release_after=planned.release_after)
    bound = lower_bound(planned.schedule, cost, sim) if sim.ok else 0.0
    return ModeResult(mode, config.chunk_size, sim, bound, planned.schedule if keep_schedule else None,
                      planned.auto_sizes)
