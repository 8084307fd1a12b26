"""Run workloads on the one event engine: one mode, one chunk size.

Data flow: ``Workload`` -> the schedule core's ``Planner`` (no clock of its own) ->
``simulate_live`` (the engine executes what the planner emits and reports every action and
transfer as it ends; after each instant the controller is asked for admission, order and
closed-loop release, as a server's would be; the durations are the run's (``durations``: the
cost model, jittered with ``--jitter``; a server's recorded ones for a reproduction) while the
controller decides with ``estimate``; a closed-loop workload submits the next request from the
planner's ``on_complete`` callback when the completion is reported; what ``auto`` sees is
``auto_size.LiveSituation``; the engine adds the accounting: exposed communication and idle by
cause) -> the emitted ``Schedule``, validated and deadlock-checked afterwards -> ``ModeResult``
(``SimResult`` + lower bound).

``run_engine`` is the entry point for any pair of estimate and durations; ``run_mode`` is the
simulator's (the estimate is the hardware cost model itself). ``plan_workload`` is the dry run
(``schedule.dry_run``: the same engine without the simulator's accounting): the same decisions
at the same times (``tests/sim/test_one_clock.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..schedule import (
    ChunkingError,
    LayoutError,
    Planner,
    RequestSpec,
    Schedule,
    Fold,
    StageCostModel,
    controller_config,
    dry_run,
    get_policy,
    check_chunk_size,
    check_num_ranks,
    policy_layout,
    schedule_from_planner,
    validate_schedule,
)
from ..schedule.auto_size import AUTO, LiveSituation
from ..schedule.factory import CLI_FILL_FLAGS, check_partial_fill, fills_batches
from .config import SimConfig
from .cost.jitter import JitteredCostModel, check_jitter
from .engine import simulate_live
from .errors import SimError
from .metrics import gap_to_bound, lower_bound
from .result import SimResult
from .workloads import Workload

__all__ = ["JITTER_BY", "RunConfig", "PlannedWorkload", "ModeResult", "plan_workload", "run_engine", "run_mode"]

JITTER_BY = ("stage", "rank")
"""What one jitter draw covers: a stage of a chunk, or a chunk's stages on one rank."""


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
    """A fixed in-flight limit for the controller (``Controller``'s ``max_in_flight``: also the pack
    cap, and no deep window); None: the mode's ``default_in_flight_limit``."""
    batch_requests: bool = True
    """Batch short requests into one forward up to ``chunk_size`` tokens, as SGLang's prefill adder
    does with its chunked-prefill budget (``Controller.joining_tokens``); False: one request per
    forward."""
    partial_fill: bool | None = None
    """With ``batch_requests``: the request that overflows the budget starts in what is left of it
    (a head; its rest runs next), as SGLang's prefill adder does; False: whole requests only;
    None: whenever requests are batched (``fills``)."""
    jitter: float = 0.0
    """Relative spread of every stage's time around the cost model's (``JitteredCostModel``);
    the controller still decides with the unjittered model, as a server decides with its
    estimates. 0: none."""
    jitter_seed: int = 0
    jitter_by: str = "stage"
    """``stage``: every stage of a chunk draws its own time; ``rank``: a chunk's stages on one
    rank share one draw (``JitteredCostModel.per_rank``)."""
    sim: SimConfig = field(default_factory=SimConfig)
    auto_chunk: bool = False
    """Let the controller's ``auto`` chunker pick the chunk size and batch budget per situation
    (``schedule/auto_size.py``): at each send, from the planner's state then (``LiveSituation``)."""
    fold: Fold = Fold.SPLIT
    """A fold-back mode's fold (``schedule/layout.py``, [Note: fused fold]); contiguous modes ignore it."""

    @property
    def fills(self) -> bool:
        """Whether a batch starts the request that overflows it (``factory.fills_batches``)."""
        return fills_batches(self.partial_fill, self.batch_requests)

    def __post_init__(self) -> None:
        try:
            check_num_ranks(self.num_ranks)
            check_chunk_size(self.chunk_size, "--chunk-size")
        except (LayoutError, ChunkingError) as error:
            raise SimError(str(error)) from None
        check_jitter(self.jitter)
        check_partial_fill(self.fills, self.batch_requests, SimError, CLI_FILL_FLAGS)
        if self.jitter_by not in JITTER_BY:
            raise SimError(f"jitter_by must be one of {', '.join(JITTER_BY)}, got {self.jitter_by!r}")


@dataclass
class PlannedWorkload:
    schedule: Schedule
    """The streams; a closed-loop request's ``arrival`` there is when it was sent (the completion
    that released it, on the run's clock)."""
    auto_sizes: tuple[int, ...] = ()
    """With ``auto_chunk``: the size chosen at each decision, in order."""
    auto_tapered: tuple[bool, ...] = ()
    """Per decision of ``auto_sizes``: the tapered cut at that size was chosen."""


@dataclass
class ModeResult:
    mode: str
    chunk_size: int
    sim: SimResult
    lower_bound_s: float
    schedule: Schedule | None = None
    auto_sizes: tuple[int, ...] = ()
    """Sizes an ``auto`` run chose, in decision order (empty: a fixed chunk size)."""
    auto_tapered: tuple[bool, ...] = ()
    """Per decision of ``auto_sizes``: the tapered cut at that size was chosen."""
    split: tuple[int, ...] = ()
    """Per-stage layer counts of the layout the run used, read back from it: the even split, the
    given one or the one ``balance_split`` chose (``--balance auto``), which nothing else records."""

    @property
    def gap_to_bound(self) -> float:
        return gap_to_bound(self.sim.makespan_s, self.lower_bound_s)

    def row(self) -> dict:
        """The mode's JSON fields (makespan, idle, TTFT, per-request TTFT and release), plus the bound,
        chunk and transfer counts, the per-rank split and the layer split: every per-run name of
        docs/metrics.md."""
        s = self.sim
        return {
            # An auto row ran at the sizes it lists, not at the cap it was given.
            "mode": self.mode, "chunk_size": AUTO if self.auto_sizes else self.chunk_size, "ttft_s": s.ttft_s,
            "throughput_tok_s": s.throughput_tok_s, "makespan_s": s.makespan_s, "start_s": s.start_s, "compute_s": s.compute_s,
            "bubble_s": s.bubble_s, "exposed_comm_s": s.exposed_comm_s, "bubble_ratio": s.bubble_ratio,
            "idle_by_cause_s": s.idle_by_cause,
            "steps": s.steps, "num_chunks": s.num_chunks, "lower_bound_s": self.lower_bound_s,
            "gap_to_bound": self.gap_to_bound, "num_requests": len(s.request_ttft_s),
            "num_tokens": s.num_tokens, "num_transfers": s.num_transfers, "deadlock": s.deadlock is not None,
            # ttft_s is their mean: the per-request values give its spread (docs/metrics.md).
            "request_ttft_s": {str(k): v for k, v in sorted(s.request_ttft_s.items())},
            "request_release_s": {str(k): v for k, v in sorted(s.request_release_s.items())},
            "per_rank": [r.to_dict() for r in s.per_rank], "split": list(self.split),
            **({"auto_chunk_sizes": sorted(set(self.auto_sizes))} if self.auto_sizes else {}),
            **({"auto_tapered_sizes": sorted({s for s, t in zip(self.auto_sizes, self.auto_tapered) if t})}
               if any(self.auto_tapered) else {}),
        }


def stage_durations(cost: StageCostModel, config: RunConfig) -> StageCostModel:
    """The durations a run executes with: ``cost``, jittered when ``config.jitter`` is set."""
    if not config.jitter:
        return cost
    return JitteredCostModel(cost, config.jitter, config.jitter_seed, per_rank=config.jitter_by == "rank")


def _workload_planner(mode: str, workload: Workload, estimate: StageCostModel, config: RunConfig,
                      num_layers: int, on_request: Callable[[int], None] | None = None) -> Planner:
    """``mode``'s planner with ``workload`` submitted: a closed-loop workload sends its next
    request from the completion callback (at the completion's time), and ``auto`` sees every
    send (``LiveSituation``); ``on_request`` hears the count of completions at each."""
    spec = get_policy(mode)
    layout = policy_layout(spec, config.num_ranks, num_layers, list(config.split) if config.split else None,
                           config.fold)
    pending = list(workload.requests)
    concurrency = workload.concurrency if workload.concurrency is not None else len(pending)
    first, pending = pending[:concurrency], pending[concurrency:]

    def on_complete(request_index: int, end: float) -> list[RequestSpec]:
        if on_request is not None:
            on_request(len(planner.request_finish))
        if not pending:
            return []
        request = pending.pop(0)
        sent = [RequestSpec(request.length, max(request.arrival, end))]
        situation.sent(sent, len(pending))
        return sent

    planner = Planner(controller_config(spec, layout, config.chunk_size, estimate, workload.max_length,
                                        batching=config.batch_requests, max_in_flight=config.max_in_flight,
                                        auto_chunk=config.auto_chunk, partial_fill=config.fills),
                      on_complete=on_complete, sees_transfers=True)
    situation = LiveSituation(planner)
    situation.sent(first, len(pending) if workload.concurrency is not None else 0)
    for request in first:
        planner.submit(request)
    return planner


def _auto_choices(planner: Planner) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    history = getattr(planner.controller.chunker, "history", ())
    return tuple(c.chunk_size for c in history), tuple(c.tapered for c in history)


def plan_workload(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig,
                  num_layers: int, durations: StageCostModel | None = None) -> PlannedWorkload:
    """The dry run of ``workload`` for ``mode`` (``schedule.dry_run``): the engine without the
    simulator's accounting, the controller deciding with ``cost`` at the times ``durations``
    gives (default: ``stage_durations(cost, config)``): ``run_engine``'s plan."""
    planner = _workload_planner(mode, workload, cost, config, num_layers)
    dry_run(planner, durations if durations is not None else stage_durations(cost, config))
    schedule = schedule_from_planner(planner)
    assert len(schedule.requests) == len(workload.requests), (len(schedule.requests), len(workload.requests))
    return PlannedWorkload(schedule, *_auto_choices(planner))


def run_engine(mode: str, workload: Workload, config: RunConfig, num_layers: int, *, estimate: StageCostModel,
               durations: StageCostModel, keep_schedule: bool = False,
               on_request: Callable[[int], None] | None = None) -> ModeResult:
    """Run ``workload`` on the engine: the controller decides with ``estimate`` at each instant
    of the simulation, whose durations come from ``durations`` (a cost model, a jittered one, a
    table of measured ones); the streams it emitted are validated afterwards."""
    planner = _workload_planner(mode, workload, estimate, config, num_layers, on_request)
    sim = simulate_live(planner, durations, config.sim)
    schedule = schedule_from_planner(planner)
    if sim.ok and config.sim.check_deadlock:
        # The emitted streams are complete, causal and paired (``simulate_live`` ran the
        # deadlock check on them).
        validate_schedule(schedule)
    if sim.ok:
        assert len(schedule.requests) == len(workload.requests), (len(schedule.requests), len(workload.requests))
    bound = lower_bound(schedule, durations, sim, [request.arrival for request in workload.requests]) if sim.ok else 0.0
    split = tuple(stage.num_layers for stage in planner.config.layout.stages)
    return ModeResult(mode, config.chunk_size, sim, bound, schedule if keep_schedule else None, *_auto_choices(planner),
                      split=split)


def run_mode(mode: str, workload: Workload, cost: StageCostModel, config: RunConfig, num_layers: int,
             keep_schedule: bool = False, on_request: Callable[[int], None] | None = None) -> ModeResult:
    """Simulate one mode: the engine with ``cost`` as the estimate and the durations (jittered
    when ``config.jitter`` is set). ``on_request``: told how many requests have completed, at each
    completion."""
    return run_engine(mode, workload, config, num_layers, estimate=cost, durations=stage_durations(cost, config),
                      keep_schedule=keep_schedule, on_request=on_request)
