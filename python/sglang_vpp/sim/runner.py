"""Run workloads through the real planner and the engine: one mode, one chunk size.

Data flow: ``Workload`` -> ``plan_workload`` (a ``Planner`` from the schedule core, online: the
controller is asked at event time on a clock whose durations are the simulated ones, with
``--jitter`` included, while it decides with the unjittered cost model as its estimate; a
closed-loop workload submits the next request from the planner's ``on_complete`` callback at the
completion time on that clock) -> ``Schedule`` + client gating (which request's completion sent
which request) -> ``simulate_schedule`` (the engine re-times the streams with the same durations
and adds what the planner's clock does not model: in-order links, pre-posted receives, idle by
cause; a gated request starts when its gate completes *in the simulation*) -> ``ModeResult``
(``SimResult`` + lower bound).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..schedule import (
    Planner,
    RequestSpec,
    Schedule,
    StageCostModel,
    build_layout,
    controller_config,
    default_in_flight_limit,
    get_policy,
    schedule_from_planner,
    validate_schedule,
)
from .config import SimConfig
from .cost.jitter import JitteredCostModel
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
    max_in_flight: int | None = None
    """Override the planner's in-flight chunk limit (default: P contiguous, 2P-1 fold-back)."""
    batch_requests: bool = True
    """Batch short requests into one forward up to ``chunk_size`` tokens, as SGLang's prefill adder
    does with its chunked-prefill budget (``Controller.joins_batch``); False: one request per
    forward."""
    jitter: float = 0.0
    """Relative spread of every stage's time around the cost model's (``JitteredCostModel``);
    the controller still decides with the unjittered model, as a server decides with its
    estimates. 0: none."""
    jitter_seed: int = 0
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


def stage_durations(cost: StageCostModel, config: RunConfig) -> StageCostModel:
    """The durations a run executes with: ``cost``, jittered when ``config.jitter`` is set."""
    return JitteredCostModel(cost, config.jitter, config.jitter_seed) if config.jitter else cost


def plan_workload(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig,
                  num_layers: int) -> PlannedWorkload:
    """Plan ``workload`` for ``mode`` with the schedule core's online planner (see module doc):
    the controller decides with ``cost``, at the times ``stage_durations`` gives."""
    spec = get_policy(mode)
    layout = build_layout(config.num_ranks, num_layers, spec.layout_kind,
                          list(config.split) if config.split else None)
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

    planner = Planner(controller_config(spec, layout, config.chunk_size, cost, workload.max_length,
                                        batching=config.batch_requests, max_in_flight=config.max_in_flight,
                                        auto_chunk=config.auto_chunk),
                      on_complete=on_complete, durations=stage_durations(cost, config))
    planner.controller.resize([r.length for r in first])
    for request in first:
        planner.submit(request)
    planner.advance()
    schedule = schedule_from_planner(planner)
    assert len(schedule.requests) == len(workload.requests), (len(schedule.requests), len(workload.requests))
    release_after = {j: g for j, g in enumerate(gates) if g is not None}
    sizes = tuple(c.chunk_size for c in getattr(planner.controller.chunker, "history", ()))
    return PlannedWorkload(schedule, release_after, dict(enumerate(arrivals)), sizes)


def run_mode(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig, num_layers: int,
             keep_schedule: bool = False) -> ModeResult:
    """Plan and simulate one mode; the planner's estimate is ``cost`` itself."""
    planned = plan_workload(mode, workload, cost, config, num_layers)
    if config.sim.check_deadlock:
        # The dry run's streams, before they run: complete, causal and paired (the deadlock dry
        # run follows in ``simulate_schedule``).
        validate_schedule(planned.schedule)
    sim_config = config.sim
    layout = planned.schedule.layout
    if sim_config.max_in_flight is None and layout.stages[-1].rank != layout.stages[0].rank:
        # SGLang's micro-batch slots: the window the controller admitted with.
        sim_config = dataclasses.replace(sim_config, max_in_flight=config.max_in_flight
                                         or default_in_flight_limit(layout, get_policy(mode)))
    durations = stage_durations(cost, config)
    sim = simulate_schedule(planned.schedule, durations, sim_config, arrivals=planned.arrivals,
                            release_after=planned.release_after)
    bound = lower_bound(planned.schedule, durations, sim) if sim.ok else 0.0
    return ModeResult(mode, config.chunk_size, sim, bound, planned.schedule if keep_schedule else None,
                      planned.auto_sizes)
