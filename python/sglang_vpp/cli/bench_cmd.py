"""``sglang-vpp bench``: real multi-process pipelined chunked prefill, every mode, one table.

Runs the reference runtime (``sglang_vpp.runtime``): a single-process reference forward, then each
mode on ``--pp`` rank processes (gloo on CPU), checks every mode's output against the reference,
and reports the measured wall clock next to the replayed dedicated-hardware timeline
(docs/runtime.md). The defaults are a few-minute CPU run of all five modes on a tiny model.

Exit codes: 0 ok; 1 a rank failed (the message names each rank's fate); 2 bad options;
3 a mode's output differs from the reference by more than 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..timeouts import MAX_TIMEOUT_S
from ..runtime.bench_config import REPEAT_UNIT, BenchConfig
from ..runtime.spec import BACKEND_FOR_DEVICE, check_pipeline_ranks
from ..schedule import check_num_requests
from ..sim.sweep import size_label
from ..verdict import check_repeats
from .progress import ProgressBars
from .common import (at_least, check_output_paths, check_split_modes, echo_wrapped, folds_any, emit_json, parse_int_list, parse_size_option,
                     timeout_option, user_errors)
from .common import (BENCH_FILL_HELP, FOLD_HELP, CliInputError, at_most, not_blank, parse_fold_option, output_option,
                     png_path, seed_option)

_DEFAULTS = BenchConfig()
"""Every flag's default is the config's own (``runtime/bench_config.py``), kept in that one place."""
TOLERANCE = 1e-5
#: Above this many prompt tokens in total a CPU run takes long (attention grows with the square of
#: the prompt): say so before starting.
LARGE_RUN_TOKENS = 128 * 1024


class _RichProgress:
    """A ``BenchProgress`` on ``ProgressBars``: the runs are (mode, repeat), their steps the
    last-stage chunks."""

    def __init__(self, bars: ProgressBars) -> None:
        self.bars = bars

    def start(self, total_runs: int) -> None:
        self.bars.start(total_runs)

    def phase(self, text: str) -> None:
        self.bars.phase(text)

    def run_started(self, mode: str, repeat: int) -> None:
        self.bars.run_started(f"{mode} (repeat {repeat + 1})", "last-stage chunks")

    def chunk_done(self, done: int, known: int) -> None:
        self.bars.step_done(done, known)

    def run_finished(self, mode: str, repeat: int, measurement: object) -> None:
        self.bars.run_finished(f"{mode} repeat {repeat + 1}")


def _text_table(title: str, rows: list[list[str]]) -> str:
    """``title``, then ``rows`` (the first is the header): the first column left-aligned; columns
    two spaces apart, one where two would pass 80 columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    sep = "  " if sum(widths) + 2 * (len(widths) - 1) <= 80 else " "
    lines = [sep.join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join([title, lines[0], sep.join("-" * w for w in widths), *lines[1:]])


def format_table(report) -> str:
    """The results, one row per mode (repeats as median with [min-max]), as three tables narrow
    enough for 80 columns: makespans, TTFTs, and the per-mode accounting."""

    def span(values: list[float]) -> str:
        import statistics

        median = f"{statistics.median(values):.3f}"
        return median if len(values) == 1 else f"{median} [{min(values):.3f}-{max(values):.3f}]"

    spread = "median [min-max] over repeats" if report.config.repeat > 1 else "one repeat"
    makespans = [["mode", "wall s", "replay makespan s", "equal-cost makespan s"]] + [
        [m.mode, span(m.wall_s), span(m.replay_makespan_s), span(m.equal_cost_makespan_s)] for m in report.modes]
    ttfts = [["mode", "wall TTFT s", "replay TTFT s", "equal-cost TTFT s"]] + [
        [m.mode, span(m.ttft_s), span(m.replay_ttft_s), span(m.equal_cost_ttft_s)] for m in report.modes]
    accounting = [["mode", "max|diff|", "chunks", "compute s", "bubble wall", "bubble replay", "exp comm s"]] + [
        [m.mode, f"{m.max_abs_diff:.1e}", str(m.num_chunks), f"{m.compute_s:.3f}", f"{m.bubble_ratio:.1%}",
         f"{m.replay_bubble_ratio:.1%}", f"{m.exposed_comm_s:.4f}"] for m in report.modes]
    return "\n\n".join([_text_table(f"makespan, s ({spread})", makespans),
                        _text_table(f"TTFT, s ({spread})", ttfts),
                        _text_table("per mode (median over repeats; max|diff|: the largest)", accounting)])


_NOTES = (
    "wall: measured on this host (the ranks share its CPUs; no speedup measurement).\n"
    "replay: the executed order re-timed with each action's measured cost (thread CPU\n"
    "  time): the dedicated-hardware timeline, with this mode's own measuring noise.\n"
    "equal-cost: every mode's executed order re-timed on ONE cost model fitted on the\n"
    "  least-disturbed costs of all modes (repeat j: fitted on the other repeats):\n"
    "  only the schedules differ; the verdict compares these.\n"
    "compute s: per rank, replayed. exp comm s: per rank, measured on this host\n"
    "  (wall clock: not the replay's, which is replay_exposed_comm_s in --json).\n"
    "max|diff|: vs the single-process reference forward with the same chunk\n"
    "  boundaries (final hidden states and last-token logits)."
)


def _arrivals_within_a_week(interval: float, requests: int) -> None:
    """The run waits for each arrival in real time, and the timeline counts it: the last request
    arrives within ``MAX_TIMEOUT_S`` (a week), the bound of every wait a command takes."""
    if requests <= 1:  # no second arrival: the interval itself is bounded like every wait
        at_most(interval, MAX_TIMEOUT_S, "--arrival-interval", "s (a week of real time)")
        return
    if interval * (requests - 1) > MAX_TIMEOUT_S:
        most = MAX_TIMEOUT_S / (requests - 1)
        raise CliInputError(f"--arrival-interval must be at most {most:g} s with --requests {requests} (the last "
                            f"arrival within {MAX_TIMEOUT_S:g} s, a week of real time), got {interval:g}")


@user_errors
def bench(
    backend: str | None = typer.Option(_DEFAULTS.backend, "--backend", help="Comm backend: gloo (CPU), nccl (cuda), hccl (npu); default by --device."),
    model: str = typer.Option(_DEFAULTS.model, "--model", help="Preset (tiny-qwen3, tiny-llama, tiny-qwen3-moe, tiny-deepseek) or a local HF model directory."),
    pp: int = typer.Option(_DEFAULTS.num_ranks, "--pp", help="Pipeline ranks (one process each)."),
    seq_len: str = typer.Option(size_label(_DEFAULTS.seq_len), "--seq-len", help="Prompt length per request (8k, 16k, 3000, ...)."),
    chunk_size: str = typer.Option(size_label(_DEFAULTS.chunk_size), "--chunk-size", help="Chunk size (base size for dcpp), or auto: the controller picks each request's."),
    modes: str = typer.Option(",".join(_DEFAULTS.modes), "--modes", help="Comma-separated modes."),
    requests: int = typer.Option(_DEFAULTS.num_requests, "--requests", help="Requests of --seq-len tokens."),
    arrival_interval: float = typer.Option(_DEFAULTS.arrival_interval_s, "--arrival-interval", help="Seconds between request arrivals (0: all queued at start)."),
    repeat: int = typer.Option(_DEFAULTS.repeat, "--repeat", help="Runs per mode (>= 2 for a verdict: ranges over repeats; the default keeps it stable on a shared host)."),
    device: str = typer.Option(str(_DEFAULTS.device), "--device", help="cpu, cuda or npu."),
    seed: int = typer.Option(_DEFAULTS.seed, "--seed", help="Weights and prompt seed."),
    split: str | None = typer.Option(None, "--split", help="Per-stage layer counts (P entries for cpp/dcpp, 2P for vpp modes, 2P-1 with --fold fused)."),
    fold: str = typer.Option(_DEFAULTS.fold, "--fold", help=FOLD_HELP),
    timeout: float = typer.Option(_DEFAULTS.timeouts.comm_s, "--timeout", help="Seconds any single communication wait may take."),
    json_out: Path | None = output_option("--json", help="Write results as JSON ('-' for stdout)."),
    trace: Path | None = output_option("--trace", help="Perfetto trace of each mode: measured and replayed."),
    plot: Path | None = output_option("--plot", help="Gantt PNG of each mode: measured and replayed."),
    costs: Path | None = output_option("--costs", help="Write measured per-action costs: a fitted cost model here, raw samples per mode next to it."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    batch_requests: bool = typer.Option(_DEFAULTS.batch_requests, "--batch-requests/--no-batch-requests", help="Batch whole requests shorter than the chunk into one forward (attention per request), as SGLang and simulate do (default); --no-batch-requests: one request per forward."),
    partial_fill: bool | None = typer.Option(_DEFAULTS.partial_fill, "--partial-fill/--no-partial-fill", show_default=False, help=BENCH_FILL_HELP),
) -> None:
    """Run each mode on real rank processes with real layers; check against the reference; table."""
    from ..runtime.bench import BenchConfig, check_config, cost_samples_path, run_bench, write_outputs
    from ..runtime.errors import RankFailedError
    from ..runtime.spec import Device, FaultSpec, Timeouts

    try:
        device_kind = Device(device)
    except ValueError:
        raise ValueError(f"--device must be cpu, cuda or npu, got {device!r}") from None
    timeout_option(timeout, "--timeout")
    not_blank(model, "--model", "give a preset (tiny-qwen3, ...) or a local Hugging Face model directory")
    not_blank(backend, "--backend", "give gloo, nccl or hccl, or drop --backend for --device's")
    check_pipeline_ranks(pp)
    check_num_requests(requests, "--requests")
    check_repeats(repeat, "--repeat", REPEAT_UNIT)
    seed_option(seed)
    at_least(arrival_interval, 0, "--arrival-interval")
    _arrivals_within_a_week(arrival_interval, requests)
    plot = png_path(plot)  # matplotlib writes out.png for --plot out
    mode_names = tuple(dict.fromkeys(m.strip() for m in modes.split(",") if m.strip()))  # a repeat runs once
    samples = [] if costs is None else [(cost_samples_path(costs, m), f"--costs's {m} samples") for m in mode_names]
    check_output_paths((json_out, "--json"), (trace, "--trace"), (plot, "--plot"), (costs, "--costs", samples))
    layer_split = parse_int_list(split, "--split")
    from ..schedule.auto_size import AUTO_CAP, is_auto

    prompt_len = parse_size_option(seq_len, "--seq-len")
    auto = is_auto(chunk_size)
    config = BenchConfig(
        model=model, num_ranks=pp, seq_len=prompt_len,
        chunk_size=AUTO_CAP if auto else parse_size_option(chunk_size, "--chunk-size"),
        auto_chunk=auto, batch_requests=batch_requests, partial_fill=partial_fill, fold=parse_fold_option(fold),
        modes=mode_names, num_requests=requests,
        arrival_interval_s=arrival_interval, repeat=repeat, device=device_kind, backend=backend, seed=seed,
        split=tuple(layer_split) if layer_split else None, timeouts=Timeouts(comm_s=timeout),
        fault=FaultSpec.from_env(),  # tests inject a failing rank through SGLANG_VPP_FAULT
    )
    check_split_modes(layer_split, mode_names, pp, config.fold)
    check_config(config)  # modes, layouts, chunk count, model, backend, device: exit 2 before any work starts
    total_tokens = config.seq_len * config.num_requests
    if total_tokens > LARGE_RUN_TOKENS and device_kind is Device.CPU:
        echo_wrapped(f"warning: {requests} x {config.seq_len} prompt tokens is a large CPU run (it may take "
                     "hours); try --seq-len 8k first", err=True)
    echo_wrapped(f"sglang-vpp bench: {model}, pp={pp}, {requests} x {config.seq_len} tokens, chunk "
                 f"{'auto' if auto else config.chunk_size}, {device_kind} / {backend or BACKEND_FOR_DEVICE[device_kind]}, repeat {repeat}"
                 + (", fused fold" if folds_any(config.modes, config.fold) else "")
                 # The settings that move the numbers and the JSON's config records, as simulate's title names them.
                 + (f", layer split {','.join(map(str, config.split))}" if config.split else "")
                 + (f", arrivals {arrival_interval:g} s apart" if arrival_interval else "")
                 + ("" if batch_requests else ", one request per forward")
                 + (", whole requests only" if batch_requests and not config.fills else ""),
                 err=True)
    from ..serving.termination import stop_signals_as_exit

    try:
        # SIGTERM (`timeout`, a job scheduler) or SIGHUP unwinds through the rank pool's close,
        # which stops the ranks and removes its directory (with the runs' outputs) from /tmp.
        with stop_signals_as_exit(), ProgressBars(enabled=not quiet) as bars:
            report = run_bench(config, _RichProgress(bars))
    except RankFailedError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    json_to_stdout = json_out is not None and str(json_out) == "-"
    typer.echo(format_table(report), err=json_to_stdout)
    typer.echo(_NOTES, err=json_to_stdout)
    for note in report.notes:
        echo_wrapped(f"note: {note}", err=json_to_stdout)
    for verdict in report.verdicts():
        typer.echo("\n".join(verdict.lines()), err=json_to_stdout)
    for path in write_outputs(report, json_out, trace, plot, costs):
        typer.echo(f"wrote {path}", err=json_to_stdout)
    if json_to_stdout:
        emit_json(report.to_json())
    bad = [m.mode for m in report.modes if not m.max_abs_diff <= TOLERANCE]
    if bad:
        typer.echo(f"error: outputs of {', '.join(bad)} differ from the reference by more than {TOLERANCE:g}", err=True)
        raise typer.Exit(3)
