"""``sglang-vpp simulate``: run the real scheduler on a simulated cluster and report TTFT,
throughput and the compute / bubble / exposed-comm breakdown per mode (docs/simulator.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from .. import json_text
from ..schedule.policies.spec import Policy
from ..schedule.policies import parse_policies
from ..sim.sweep import SweepProgress, size_label
from ..sim.workloads import CONCURRENCY_HELP, REQUESTS_HELP, check_counts
from ..sim.workloads.long import DEFAULT_LENGTH
from .progress import ProgressBars
from .common import (FILL_DEFAULT, FILL_HELP, FOLD_HELP, check_output_paths, check_split_modes, echo_wrapped, folds_any, emit_json, given_flags, parse_fold_option,
                     parse_int_list, output_option, parse_size_option, png_path, seed_option, user_errors)

DEFAULT_LONG_SEQ_LEN = size_label(DEFAULT_LENGTH)
"""``--seq-len``'s default for the long workload, as the flag writes it (``128k``)."""

def _sizes(text: str, what: str, auto: bool = False) -> list:
    """Sizes of a comma-separated flag; with ``auto`` an entry may be ``auto`` (kept as the string)."""
    from ..schedule.auto_size import AUTO, is_auto

    sizes = [AUTO if auto and is_auto(part) else parse_size_option(part.strip(), what)
             for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError(f"{what} needs at least one size, e.g. 24k or 8k,16k")
    # Once each, as --modes: a repeated size (1k,auto,1k or 1k,1024) would run and print again.
    return list(dict.fromkeys(sizes))


def _cost_model(model_spec, hardware_spec, tp: Optional[int], costs: Optional[Path]):
    from ..sim.cost.analytic import AnalyticCostModel

    analytic = AnalyticCostModel(model_spec, hardware_spec, tp)
    if costs is None:
        return analytic
    import json

    from ..schedule.fitted_cost import FittedCostModel
    from ..sim.cost_model import TableCostModel
    from ..sim.errors import CostModelError

    if not costs.exists():
        raise CostModelError(f"--costs file {str(costs)!r} does not exist")
    try:
        data = json_text.loads(costs.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CostModelError(f"--costs {str(costs)!r} is not readable JSON ({error}); write one with "
                             "sglang-vpp bench --costs FILE") from None
    kind = data.get("format") if isinstance(data, dict) else None
    try:
        if kind == "sglang-vpp.fitted-cost":
            return FittedCostModel.from_json(data)
        if kind == "sglang-vpp.table-cost":
            return TableCostModel.from_json(data, fallback=analytic)
    except CostModelError as error:
        raise CostModelError(f"--costs {str(costs)!r} is {error}") from None
    found = "has no \"format\" field" if kind is None else f"has format {kind!r}"
    raise CostModelError(f"--costs {str(costs)!r} {found}; expected sglang-vpp.fitted-cost or "
                         "sglang-vpp.table-cost (see docs/calibration.md)")


def _check_costs_layouts(cost, costs: Optional[Path], modes: str, pp: int, num_layers: int, split, fold: str,
                         balance: str) -> None:
    """A fitted cost file answers for every stage of each mode's layout, checked before the first
    mode runs (``balance auto`` picks its split while it runs); another depth only warns
    (``_warn_other_depth``)."""
    from ..schedule import parse_policies, policy_layout
    from ..schedule.fitted_cost import FittedCostModel
    from ..sim.errors import CostModelError

    if not isinstance(cost, FittedCostModel) or balance != "even":
        return
    for spec in parse_policies(modes):
        try:
            cost.check_layout(policy_layout(spec, pp, num_layers, split, fold), other_depth=True)
        except CostModelError as error:
            raise CostModelError(f"--costs {str(costs)!r} {error} (--modes {spec.name})") from None


def _reads_hardware(cost) -> bool:
    """Whether a run on ``cost`` reads the hardware preset: a fitted cost file times every stage and
    hand-off itself and replaces the analytic model the preset (and ``--tp``) set; a table file
    keeps it for the actions it did not measure."""
    from ..schedule.fitted_cost import FittedCostModel

    return not isinstance(cost, FittedCostModel)


def _refuse_unread_hardware(ctx: typer.Context, cost, costs: Optional[Path]) -> None:
    """``--hardware`` and ``--tp`` next to a cost file that does not read them would change nothing."""
    unread = [] if _reads_hardware(cost) else given_flags(ctx, {"hardware": "--hardware", "tp": "--tp"})
    if unread:
        raise ValueError(f"--costs {str(costs)!r} is a fitted cost model, which times every stage itself: "
                         f"{', '.join(unread)} would change nothing; drop {', '.join(unread)}")


def _warn_other_depth(cost, costs: Optional[Path], model_spec) -> None:
    """A measured per-layer cost is multiplied by --model's layer count, the one thing --model
    still sets with --costs: scaling it to another depth is a what-if worth running, but never
    without saying so (files written before the count was recorded cannot be checked)."""
    from ..schedule.fitted_cost import FittedCostModel

    depth = cost.other_depth(model_spec.num_layers) if costs is not None and isinstance(cost, FittedCostModel) else None
    if depth is not None:
        typer.echo(f"warning: --costs {costs} {depth}; --model {model_spec.name} "
                   f"has {model_spec.num_layers}: the measured per-layer cost is scaled to "
                   f"{model_spec.num_layers} layers", err=True)


class _RunsProgress(SweepProgress):
    """``simulate``'s progress on ``ProgressBars``: one run per (prompt length, chunk size, mode),
    its steps the requests completed."""

    def __init__(self, bars: ProgressBars) -> None:
        self.bars = bars
        self.prompts = ""
        """The prompt length of the runs to come, where there are several (``--seq-len 64k,128k``)."""

    def run_started(self, mode: str, size: str, num_requests: int) -> None:
        self.bars.run_started(f"{self.prompts}{mode} at {size}", "requests completed", num_requests)

    def request_done(self, done: int) -> None:
        self.bars.step_done(done)

    def run_finished(self, mode: str, size: str) -> None:
        self.bars.run_finished(f"{self.prompts}{mode} at {size}")


@user_errors
def simulate(
    ctx: typer.Context,
    model: str = typer.Option("deepseek-v3.1", "--model", help="Model preset (or a .json path)."),
    hardware: str = typer.Option("ascend-910c", "--hardware", help="Hardware preset (or a .json path)."),
    pp: int = typer.Option(2, "--pp", help="Pipeline ranks P."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Chips per rank (default: the hardware preset's)."),
    workload: str = typer.Option("long", "--workload", help="long, short, mixed or file."),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help=f"Prompt length(s): 512k; long takes a list (64k,128k) and defaults to {DEFAULT_LONG_SEQ_LEN}."),
    chunk_size: str = typer.Option("24k", "--chunk-size", help="Chunk size (base size for dcpp), or auto: the controller picks the size and batch budget per situation."),
    modes: str = typer.Option(",".join(Policy), "--modes", help="Comma-separated modes."),
    requests: Optional[int] = typer.Option(None, "--requests", help=REQUESTS_HELP),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help=CONCURRENCY_HELP),
    file: Optional[Path] = typer.Option(None, "--file", help="JSONL of {\"length\", \"arrival\"} for --workload file."),
    seed: int = typer.Option(0, "--seed", help="Seed of the mixed workload."),
    sweep_chunk: Optional[str] = typer.Option(None, "--sweep-chunk", help="Chunk sizes to sweep (8k,16k,24k,32k; auto allowed); * marks each mode's best: its smallest makespan."),
    split: Optional[str] = typer.Option(None, "--split", help="Per-stage layer counts (P or 2P entries by layout; 2P-1 with --fold fused)."),
    fold: str = typer.Option("split", "--fold", help=FOLD_HELP),
    balance: str = typer.Option("even", "--balance", help="Layer split: even, or auto (the planner picks one for the cost model's tau curve)."),
    costs: Optional[Path] = typer.Option(None, "--costs", help="Fitted or table cost JSON from measured samples instead of the analytic model."),
    jitter: float = typer.Option(0.0, "--jitter", help="What-if: relative spread of every stage's time (0.03 = 3%), drawn per stage and chunk; the controller still decides with the cost model."),
    jitter_seed: int = typer.Option(0, "--jitter-seed", help="Seed of the --jitter draws."),
    partial_fill: bool = typer.Option(FILL_DEFAULT, "--partial-fill/--no-partial-fill", help=FILL_HELP),
    json_out: Optional[Path] = output_option("--json", help="Write results as JSON ('-' for stdout)."),
    trace: Optional[Path] = output_option("--trace", help="Write a Perfetto/Chrome trace of each mode's run."),
    plot: Optional[Path] = output_option("--plot", help="Write a Gantt PNG of each mode's run."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Show progress on stderr: a bar over the runs and the current run's requests, a line per finished run (default: when stderr is a terminal)."),
) -> None:
    """Simulate prefill of a workload under each mode with the real planner and print a table.

    Traces and plots show each mode at --chunk-size on the first --seq-len (with --sweep-chunk:
    at its best chunk size).
    """
    from ..sim.config import SimConfig
    from ..sim.preset_loader import load_hardware, load_model, preset_file
    from ..sim.sweep import (best_by_mode, chunk_label, format_idle_table, format_splits, format_table,
                             simulate_matrix)
    from ..sim.cost.jitter import check_jitter
    from ..sim.workloads import build_workload

    plot = png_path(plot)
    parse_fold_option(fold)
    if workload == "long" and seq_len is None:
        seq_len = DEFAULT_LONG_SEQ_LEN
    check_output_paths((json_out, "--json"), (trace, "--trace"), (plot, "--plot"),
                       inputs=((costs, "--costs"), (file, "--file"), (preset_file("models", model), "--model"),
                               (preset_file("hardware", hardware), "--hardware")))
    model_spec = load_model(model)
    hardware_spec = load_hardware(hardware)
    cost = _cost_model(model_spec, hardware_spec, tp, costs)
    _refuse_unread_hardware(ctx, cost, costs)
    _warn_other_depth(cost, costs, model_spec)
    lengths = _sizes(seq_len, "--seq-len") if seq_len else None
    if sweep_chunk is not None and given_flags(ctx, {"chunk_size": "--chunk-size"}):
        raise ValueError("--sweep-chunk replaces --chunk-size; give the sizes to sweep in --sweep-chunk and drop "
                         "--chunk-size")
    # An empty --sweep-chunk is refused, not read as absent.
    chunk_sizes = (_sizes(sweep_chunk, "--sweep-chunk", True) if sweep_chunk is not None
                   else _sizes(chunk_size, "--chunk-size", True))
    layer_split = parse_int_list(split, "--split")
    sim_config = SimConfig(record_timeline=bool(trace or plot))
    # None when not given: a workload that draws nothing refuses an explicit --seed.
    given_seed = seed if given_flags(ctx, {"seed": "--seed"}) else None
    if given_seed is not None:  # random.Random seeds with |seed|: -1 would draw what 1 draws
        seed_option(given_seed)
    from ..schedule import check_num_ranks, check_request_count, plan_stages

    check_num_ranks(pp)
    check_counts(requests, concurrency)
    if requests is not None:  # checked before the workload lists them
        check_request_count(requests, plan_stages(modes, pp, fold), pp, "--requests")
    if workload == "long" and lengths:
        runs = [(n, build_workload("long", lengths=[n], num_requests=requests, concurrency=concurrency,
                                   seed=given_seed, path=str(file) if file else None)) for n in lengths]
    else:
        built = build_workload(workload, lengths=lengths, num_requests=requests, concurrency=concurrency,
                               seed=given_seed, path=str(file) if file else None)
        runs = [(lengths[0] if lengths and workload == "short" else None, built)]
    from ..schedule import check_chunk_counts

    stages = plan_stages(modes, pp, fold)
    size_flag = "--sweep-chunk" if sweep_chunk else "--chunk-size"
    longest = "a --seq-len request" if workload in ("long", "short") else f"the longest {workload} request"
    for _, work in runs:
        for size in chunk_sizes:
            if not isinstance(size, str):  # auto picks among sizes that cut no request that finely
                check_chunk_counts([r.length for r in work.requests], size, stages, pp, size_flag, longest,
                                   f"the {workload} workload")
    check_jitter(jitter)
    if jitter == 0 and given_flags(ctx, {"jitter_seed": "--jitter-seed"}):
        raise ValueError("--jitter-seed seeds --jitter's draws, and without --jitter there are none; give "
                         "--jitter (e.g. 0.03) or drop --jitter-seed")
    if balance == "even":  # otherwise the run refuses --balance (or --split next to auto) itself
        check_split_modes(layer_split, modes, pp, fold)
    _check_costs_layouts(cost, costs, modes, pp, model_spec.num_layers, layer_split, fold, balance)
    rows = []
    shown = sys.stderr.isatty() if progress is None else progress
    with ProgressBars(shown) as bars:
        bars.start(len(runs) * len(chunk_sizes) * len(parse_policies(modes)))
        told = _RunsProgress(bars)
        for length, work in runs:
            told.prompts = f"{size_label(length)} prompts, " if len(runs) > 1 else ""
            rows += simulate_matrix(work, cost, model_spec.num_layers, modes, chunk_sizes, pp, layer_split,
                                    sim_config, seq_len=length, balance=balance, jitter=jitter,
                                    jitter_seed=jitter_seed, fold=fold, partial_fill=partial_fill, progress=told)
    # With --json - the JSON owns stdout; the human-readable table goes to stderr.
    to_stderr = json_out is not None and str(json_out) == "-"
    # Measured costs replace the hardware: the title says whose they are, not the preset's.
    measured_on = getattr(cost, "meta", {}).get("model") if costs is not None else None
    where = (f"on {hardware_spec.name} (tp={getattr(cost, 'tp', '-')})" if costs is None else
             f"({model_spec.num_layers} layers) on the measured costs in {costs}"
             + (f" (measured on {measured_on})" if measured_on else ""))
    # Every setting that moves the numbers and the JSON's config records is named in the title too.
    title = (f"{model_spec.name} {where}, pp={pp}, " + ("fused fold, " if folds_any(modes, fold) else "") +
             ("layer split by --balance auto, " if balance == "auto" else "") +
             (f"layer split {','.join(map(str, layer_split))}, " if layer_split else "") +
             (f"jitter {jitter * 100:g}% (seed {jitter_seed}), " if jitter else "") +
             ("whole requests only, " if not partial_fill else "") +
             f"workload {runs[0][1].description}" + (f" (+{len(runs) - 1} more lengths)" if len(runs) > 1 else ""))
    echo_wrapped(title, err=to_stderr)
    typer.echo(format_table(rows, mark_best=bool(sweep_chunk)), err=to_stderr)
    typer.echo(format_idle_table(rows), err=to_stderr)
    if balance == "auto":  # the split is the planner's choice: the rows say which (also the JSON's "split")
        typer.echo(format_splits(rows), err=to_stderr)
    if json_out is not None:
        bounds = {}
        for row in rows:
            if row.result.sim.ok:
                key = row.bound_key
                bounds[key] = min(bounds.get(key, float("inf")), row.result.lower_bound_s)
        hardware_used = hardware_spec.name if _reads_hardware(cost) else None
        emit_json({
            "config": {"model": model_spec.name, "hardware": hardware_used, "pp": pp, "tp": getattr(cost, "tp", None),
                       "workload": workload, "chunk_sizes": chunk_sizes, "modes": modes, "balance": balance,
                       "split": layer_split, "fold": fold,
                       "cost_model": type(cost).__name__, "jitter": jitter, "jitter_seed": jitter_seed,
                       "partial_fill": partial_fill},
            "results": [row.to_dict() for row in rows],
            "run_lower_bound_s": bounds,
        }, json_out)
    if trace or plot:
        first = runs[0][0]
        if sweep_chunk:
            chosen = [row for key, row in best_by_mode(rows).items() if key[0] == first]
        else:
            wanted = str(chunk_sizes[0]) if isinstance(chunk_sizes[0], str) else None
            chosen = [row for row in rows if row.seq_len == first and (
                chunk_label(row.result) == wanted if wanted else
                not row.result.auto_sizes and row.result.chunk_size == chunk_sizes[0])]
        timelines = {f"{row.result.mode} chunk {chunk_label(row.result)}": row.result.sim
                     for row in chosen if row.result.sim.ok}
        if trace:
            from ..sim.trace import write_perfetto_trace

            write_perfetto_trace(timelines, trace)
            typer.echo(f"trace: {trace} (open in https://ui.perfetto.dev)", err=to_stderr)
        if plot:
            from ..sim.trace import write_gantt_png

            write_gantt_png(timelines, plot, title=f"{model_spec.name} {where}, pp={pp}")
            typer.echo(f"plot: {plot}", err=to_stderr)
