"""``run_bench``: every mode on real ranks, checked against the reference, measured and replayed.

Data flow::

    BenchConfig --RankPool (one start-up)--> for mode, repeat: pool.run(RunSpec)
                    -> reference_forward (single process, the run's chunk boundaries; cached)
                    -> max |pipelined - reference|   (final hidden states and last-token logits)
                    -> measure_run   (wall clock on this host: compute / exposed comm / idle, TTFT)
                    -> replay_run    (dedicated-hardware timeline from measured per-action costs)
               -> equal_cost_replay (per repeat: every mode's executed order on ONE cost model
                                     fitted on the least-disturbed samples of all modes)
               --> BenchReport: one ModeSummary per mode (lists hold one value per repeat),
                   verdicts (equal-cost makespan and TTFT vs cpp and dcpp, paired per repeat),
                   traces and plots of the last repeat, measured costs for calibration

Nothing here prints; ``BenchProgress`` callbacks let the CLI draw its progress bar.
Field definitions: docs/runtime.md.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..schedule import FlatCurveFallback, check_chunk_counts, check_num_requests, check_request_count, parse_policies, plan_stages
from ..verdict import Verdict, check_repeats, make_verdict
from .equal_cost import EQUAL_COST_LABEL, MeasuredRunCosts, SharedCostModel, equal_cost_replay
from .control import run_controller_config
from .launcher import LaunchResult, PoolSpec, RankPool, check_spec
from .metrics import MeasuredRun, measure_run
from .models import resolve_model
from .profile import profiled_cost_model
from .reference import RequestOutput, max_abs_diff, reference_device, reference_forward
from .replay import (
    MEASURED_LABEL,
    REPLAY_LABEL,
    ReplayResult,
    replay_run,
    write_traces,
)
from .bench_config import REPEAT_UNIT, BenchConfig
from .spec import DEFAULT_MODES, Device, RunSpec

__all__ = [
    "DEFAULT_MODES",
    "JSON_FIELDS",
    "BenchConfig",
    "BenchProgress",
    "BenchReport",
    "ModeSummary",
    "RunMeasurement",
    "check_config",
    "run_bench",
]

#: The per-mode JSON fields named by issue 5, in order (a CLI test freezes them).
JSON_FIELDS = ("mode", "max_abs_diff", "wall_s", "replay_makespan_s", "compute_s", "bubble_ratio",
               "replay_bubble_ratio", "exposed_comm_s", "ttft_s")
_LIST_FIELDS = ("wall_s", "replay_makespan_s", "ttft_s", "replay_ttft_s", "bubble_ratio_runs",
                "replay_bubble_ratio_runs", "equal_cost_makespan_s", "equal_cost_ttft_s")


class BenchProgress:
    """Callbacks for a progress display; every method is optional (no-ops here)."""

    def start(self, total_runs: int) -> None: ...

    def phase(self, text: str) -> None: ...

    def run_started(self, mode: str, repeat: int) -> None: ...

    def chunk_done(self, done: int, known: int) -> None: ...

    def run_finished(self, mode: str, repeat: int, measurement: RunMeasurement) -> None: ...


@dataclass
class RunMeasurement:
    mode: str
    repeat: int
    max_abs_diff: float
    measured: MeasuredRun
    replay: ReplayResult
    launch: LaunchResult
    equal_cost: Any = None
    """``SimResult`` of this run's executed order on its repeat's shared cost model (fitted on
    the other repeats)."""


@dataclass
class ModeSummary:
    """One mode over all repeats (lists: one value per repeat; scalars: median over repeats)."""

    mode: str
    max_abs_diff: float
    wall_s: list[float]
    replay_makespan_s: list[float]
    compute_s: float
    bubble_ratio: float
    replay_bubble_ratio: float
    exposed_comm_s: float
    ttft_s: list[float]
    replay_ttft_s: list[float]
    replay_exposed_comm_s: float
    compute_cost_s: float
    num_chunks: int
    bubble_ratio_runs: list[float]
    replay_bubble_ratio_runs: list[float]
    equal_cost_makespan_s: list[float] = field(default_factory=list)
    """Per repeat: the executed order on that repeat's shared cost model (``equal_cost.py``)."""
    equal_cost_ttft_s: list[float] = field(default_factory=list)
    per_rank: list[dict[str, float]] = field(default_factory=list)
    """Last repeat, per rank: measured ``compute_s`` / ``bubble_s`` / ``exposed_comm_s`` (wall
    clock) and the same three on the replayed timeline (``replay_*``)."""

    def to_dict(self) -> dict:
        data: dict[str, Any] = {name: getattr(self, name) for name in JSON_FIELDS}
        extra = {k: v for k, v in asdict(self).items() if k not in data}
        data.update(extra)
        data["stats"] = {name: _spread(getattr(self, name)) for name in _LIST_FIELDS}
        return data


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


@dataclass
class BenchReport:
    config: BenchConfig
    modes: list[ModeSummary]
    runs: list[RunMeasurement]
    reference_cpu_s: float
    shared_costs: list[SharedCostModel] = field(default_factory=list)
    """One per repeat: fitted on the other repeats (``_replay_on_equal_costs``)."""
    notes: list[str] = field(default_factory=list)
    """Modes that ran otherwise than asked, and why (``_fallback_notes``)."""

    def verdicts(self) -> list[Verdict]:
        """Equal-cost makespan and TTFT (paired per repeat), every mode vs cpp and dcpp."""
        return [make_verdict({m.mode: m.equal_cost_makespan_s for m in self.modes}, "equal-cost makespan", paired=True),
                make_verdict({m.mode: m.equal_cost_ttft_s for m in self.modes}, "equal-cost TTFT", paired=True)]

    def to_json(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "labels": {"wall": MEASURED_LABEL, "replay": REPLAY_LABEL, "equal_cost": EQUAL_COST_LABEL},
            "reference_cpu_s": self.reference_cpu_s,
            "results": [m.to_dict() for m in self.modes],
            "equal_cost_models": [model.to_dict() for model in self.shared_costs],
            "verdicts": [v.to_dict() for v in self.verdicts()],
            "notes": self.notes,
        }

    def timelines(self) -> dict[str, Any]:
        """Labelled timelines of each mode's last repeat: measured and replayed."""
        last = {run.mode: run for run in self.runs}
        out: dict[str, Any] = {}
        for mode, run in last.items():
            out[f"{mode}: {MEASURED_LABEL}"] = run.measured.timeline
            out[f"{mode}: {REPLAY_LABEL}"] = run.replay.result
        return out

    def cost_samples(self, mode: str) -> list:
        return [s for run in self.runs if run.mode == mode for s in run.replay.samples]


def _summarise(mode: str, runs: list[RunMeasurement]) -> ModeSummary:
    med = statistics.median
    return ModeSummary(
        mode=mode,
        max_abs_diff=max(r.max_abs_diff for r in runs),
        wall_s=[r.measured.makespan_s for r in runs],
        replay_makespan_s=[r.replay.result.makespan_s for r in runs],
        compute_s=med(r.replay.result.compute_s for r in runs),
        bubble_ratio=med(r.measured.bubble_ratio for r in runs),
        replay_bubble_ratio=med(r.replay.result.bubble_ratio for r in runs),
        exposed_comm_s=med(r.measured.exposed_comm_s for r in runs),
        ttft_s=[r.measured.ttft_s for r in runs],
        replay_ttft_s=[r.replay.result.ttft_s for r in runs],
        replay_exposed_comm_s=med(r.replay.result.exposed_comm_s for r in runs),
        compute_cost_s=med(r.measured.compute_cost_s for r in runs),
        num_chunks=runs[-1].measured.num_chunks,
        bubble_ratio_runs=[r.measured.bubble_ratio for r in runs],
        replay_bubble_ratio_runs=[r.replay.result.bubble_ratio for r in runs],
        equal_cost_makespan_s=[r.equal_cost.makespan_s for r in runs],
        equal_cost_ttft_s=[r.equal_cost.ttft_s for r in runs],
        per_rank=_per_rank(runs[-1]),
    )


def _per_rank(run: RunMeasurement) -> list[dict[str, float]]:
    out = []
    for measured, replayed in zip(run.measured.per_rank, run.replay.result.per_rank):
        out.append({"rank": measured.rank, "compute_s": measured.compute_s, "bubble_s": measured.bubble_s,
                    "exposed_comm_s": measured.exposed_comm_s, "replay_compute_s": replayed.compute_s,
                    "replay_bubble_s": replayed.bubble_s, "replay_exposed_comm_s": replayed.exposed_comm_s})
    return out


def check_config(config: BenchConfig) -> None:
    """Modes, layouts, the model, the comm backend and the device, checked in this process before
    anything starts: a typo or a missing GPU is a user error with its fix, not a rank failure."""
    from ..comm.registry import parse_backend_spec, probe_backend
    from .errors import RunConfigError
    from .spec import BACKEND_FOR_DEVICE

    policies = parse_policies(",".join(config.modes))
    stages = plan_stages(policies, config.num_ranks, config.fold)
    check_request_count(config.num_requests, stages, config.num_ranks, "--requests")
    if not config.auto_chunk:  # auto's sizes cut no request into too many chunks
        check_chunk_counts([config.seq_len] * config.num_requests, config.chunk_size, stages, config.num_ranks,
                           "--chunk-size", "a --seq-len request", "the --requests x --seq-len load")
    resolve_model(config.model, config.seed, config.num_layers)
    for policy in policies:
        check_spec(config.run_spec(str(policy.name)))
    spec = config.backend or BACKEND_FOR_DEVICE[config.device]
    name, double = parse_backend_spec(spec)
    if not double:  # the device test double runs on gloo anywhere
        status = probe_backend(name)
        if not status.available:
            raise RunConfigError(f"--backend {name} is not available here: {status.reason}. Fix: {status.fix}")
    check_device(config.device)


def check_device(device: Device) -> None:
    """A device this host cannot run on is a user error before anything starts (``bench`` and
    ``bench-serve --launch``)."""
    from .errors import RunConfigError

    if device is Device.CUDA and not _cuda_available():
        raise RunConfigError("--device cuda needs a CUDA build of torch and a visible GPU; use --device cpu here")
    if device is Device.NPU and importlib.util.find_spec("torch_npu") is None:
        raise RunConfigError("--device npu needs torch_npu (the Ascend stack); use --device cpu here")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def run_bench(config: BenchConfig, progress: BenchProgress | None = None) -> BenchReport:
    """Run every mode ``config.repeat`` times on one rank pool (see the module docstring)."""
    progress = progress or BenchProgress()
    modes = [str(p.name) for p in parse_policies(",".join(config.modes))]
    check_repeats(config.repeat, "--repeat", REPEAT_UNIT)
    check_num_requests(config.num_requests, "--requests")
    for mode in modes:
        check_spec(config.run_spec(mode))  # every user error before any work starts
    source = resolve_model(config.model, config.seed, config.num_layers)
    progress.start(len(modes) * config.repeat)
    planner_cost = None
    if config.profile_planner:
        progress.phase("profiling one layer for the planner")
        # No request's chunk is longer than its prompt, whatever the batch budget: the fit's
        # token terms are per request (a batched forward sums them).
        planner_cost = profiled_cost_model(source, min(config.chunk_size, config.seq_len), config.seq_len)
    specs = {mode: config.run_spec(mode, planner_cost) for mode in modes}
    for spec in specs.values():
        check_spec(spec)
    notes = _fallback_notes(list(specs.values()), source.config.num_hidden_layers)
    progress.phase(f"starting {config.num_ranks} rank processes")
    runs: list[RunMeasurement] = []
    references = _References(source, config, progress)
    with RankPool(PoolSpec.of(next(iter(specs.values())))) as pool:
        for repeat in range(config.repeat):
            for mode in modes:
                spec = specs[mode]
                progress.run_started(mode, repeat)
                launched = pool.run(spec, progress.chunk_done)
                reference = references.get(launched.reports[0].chunks)
                runs.append(_measure(mode, repeat, spec, launched, reference, source.config.num_hidden_layers))
                progress.run_finished(mode, repeat, runs[-1])
    progress.phase("equal-cost replay")
    shared = _replay_on_equal_costs(config, runs)
    summaries = [_summarise(mode, [r for r in runs if r.mode == mode]) for mode in modes]
    return BenchReport(config, summaries, runs, references.cpu_s, shared, notes)


def _fallback_notes(specs: Sequence[RunSpec], num_layers: int) -> list[str]:
    """What ran otherwise than asked: a dcpp whose profiled latency curve is flat runs fixed chunks."""
    notes = []
    for spec in specs:
        chunker = run_controller_config(spec, spec.layout(num_layers)).chunker
        if isinstance(chunker, FlatCurveFallback):
            notes.append(chunker.reason)
    return notes


def _replay_on_equal_costs(config: BenchConfig, runs: list[RunMeasurement]) -> list[SharedCostModel]:
    """Per repeat ``j``: every mode's executed order of repeat ``j`` on one shared cost model
    fitted on the *other* repeats (leave one out; all repeats when there is only one).

    Leaving one out makes each model the least-disturbed costs of several repeats, and the range
    over ``j`` shows how much the comparison depends on which measurements built the model. A
    chunk position the other repeats never ran falls back to the model of all repeats. The
    requests arrive as configured (not as measured), so every mode sees the same arrivals."""

    def costs(subset: list[RunMeasurement]) -> list[MeasuredRunCosts]:
        return [MeasuredRunCosts(r.mode, r.replay.schedule.layout, r.replay.samples) for r in subset]

    everything = SharedCostModel.fit(costs(runs))
    arrivals = {i: i * config.arrival_interval_s for i in range(config.num_requests)}
    models = []
    for repeat in sorted({r.repeat for r in runs}):
        others = [r for r in runs if r.repeat != repeat]
        model = SharedCostModel.fit(costs(others), fallback=everything) if others else everything
        for run in runs:
            if run.repeat == repeat:
                run.equal_cost = equal_cost_replay(run.replay.schedule, model, arrivals)
        models.append(model)
    return models


class _References:
    """Single-process reference outputs, one forward per distinct chunking (dcpp chunks differently).

    The same chunk boundaries make the reference perform the pipeline's operations on the same
    shapes, so equality is exact; that chunked and whole-prompt forwards agree is a test of its own
    (tests/runtime/test_models.py)."""

    def __init__(self, source: Any, config: BenchConfig, progress: BenchProgress) -> None:
        self.source, self.config, self.progress = source, config, progress
        self.cache: dict[tuple, list[RequestOutput]] = {}
        self.cpu_s = 0.0

    def get(self, chunks: list[tuple]) -> list[RequestOutput]:
        import torch

        from ..schedule import ChunkSpec

        key = tuple(chunks)
        if key not in self.cache:
            self.progress.phase("single-process reference forward")
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the same arithmetic as the one-thread ranks
            try:
                result = reference_forward(self.source, [self.config.seq_len] * self.config.num_requests,
                                           chunks=[ChunkSpec(*c) for c in chunks], token_seed=self.config.seed,
                                           device=reference_device(self.config.device))
            finally:
                torch.set_num_threads(threads)
            self.cache[key] = result.outputs
            self.cpu_s += sum(cost for _, cost in result.chunk_costs)
        return self.cache[key]


def _measure(mode: str, repeat: int, spec: RunSpec, launched: LaunchResult,
             reference: list[RequestOutput], num_layers: int) -> RunMeasurement:
    layout = spec.layout(num_layers)
    got = [RequestOutput(k, hidden, logits) for k, (hidden, logits) in launched.outputs.items()]
    diff = max_abs_diff(got, reference)
    measured = measure_run(launched.reports, layout.last_stage)
    replay = replay_run(spec, layout, launched.reports)
    return RunMeasurement(mode, repeat, diff, measured, replay, launched)


def write_outputs(report: BenchReport, json_path: Path | None = None, trace_path: Path | None = None,
                  plot_path: Path | None = None, costs_path: Path | None = None) -> list[Path]:
    """Write the requested files; return what was written."""
    written: list[Path] = []
    if json_path is not None and str(json_path) != "-":
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        written.append(json_path)
    if trace_path is not None or plot_path is not None:
        config = report.config
        title = (f"{config.model}, pp={config.num_ranks}, {config.num_requests} x {config.seq_len} tokens, "
                 f"chunk {'auto' if config.auto_chunk else config.chunk_size}")
        write_traces(trace_path, plot_path, report.timelines(), title)
        written += [p for p in (trace_path, plot_path) if p is not None]
    if costs_path is not None:
        written += write_costs(report, costs_path)
    return written


def cost_samples_path(path: Path, mode: str) -> Path:
    """Where ``write_costs`` puts ``mode``'s raw samples next to the fitted model at ``path``."""
    return path.with_name(f"{path.stem}.{mode}.json")


def write_costs(report: BenchReport, path: Path) -> list[Path]:
    """Calibration output: ``path`` holds a per-layer ``FittedCostModel`` of every measured compute
    (portable across layouts, readable by ``sglang-vpp simulate --costs``; transfers as the replay
    counts them, ``replay.replay_samples``); next to it, one cost-samples file per mode
    (``<stem>.<mode>.json``) with the raw measurements."""
    from ..schedule.fitted_cost import FittedCostModel
    from ..sim.cost.fitted import fit_cost_model
    from .replay import replay_samples, write_cost_samples

    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    everything = []
    for summary in report.modes:
        samples = report.cost_samples(summary.mode)
        everything += samples
        target = cost_samples_path(path, summary.mode)
        write_cost_samples(samples, target, {"mode": summary.mode, **report.config.to_dict()})
        written.append(target)
    # Stage indices mean different layers in different layouts: keep only the per-layer fit.
    fitted = fit_cost_model(replay_samples(everything))
    # The layer count lets ``simulate --costs`` tell a model of another depth (its --model).
    num_layers = report.runs[0].replay.schedule.layout.num_layers if report.runs else None
    model = FittedCostModel({}, fitted.per_layer, fitted.transfer,
                            {"source": "sglang-vpp bench", "modes": list(report.config.modes),
                             "model": report.config.model, "num_layers": num_layers,
                             "cost": "thread CPU seconds per compute"})
    model.save(path)
    return [path] + written
