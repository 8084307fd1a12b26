"""``sglang-vpp bench-serve``: TTFT, end-to-end latency and throughput of any SGLang server.

Job: drive a running server (stock SGLang or SGLang with this plugin, any ``--pp-mode``) over
HTTP with a workload, so users compare modes side by side on their own hardware; with
``--launch`` start each mode's server in turn and add the replayed per-rank pipeline accounting
and a verdict. The parts live in ``sglang_vpp.serving``: ``workload`` (the requests),
``client`` (streaming HTTP, statistics), ``run_plan`` (warm-up and measured passes),
``results`` (tagged JSON lines), ``plots``; this module parses options and prints tables.

Wall-clock numbers on a shared 2-vCPU machine do not show a pipeline speedup; see
CONTRIBUTING.md rule 8.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import typer

from sglang_vpp.serving.client import RequestResult, Stats, Summary, connection, run_requests, server_info, summarize
from sglang_vpp.serving.run_plan import RunPlan
from sglang_vpp.serving.workload import (
    FIRST_TOKEN_ID,
    WORKLOAD_DEFAULTS,
    BenchRequest,
    BenchServeError,
    Workload,
    make_workload,
)

from .common import at_least, check_output_path, emit_json, parse_size_option, positive, user_errors

__all__ = [
    "BenchRequest",
    "BenchServeError",
    "RequestResult",
    "Stats",
    "Workload",
    "bench_serve",
    "make_workload",
    "run_requests",
    "summarize",
]


def _print_summary(summary: Summary, label: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"bench-serve{f' [{label}]' if label else ''}")
    for column in ("metric", "min", "median", "max", "p90"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    for name, stats, scale, unit in (
        ("TTFT", summary.ttft, 1.0, "s"),
        ("end-to-end latency", summary.latency, 1.0, "s"),
        ("time per output token", summary.time_per_output_token, 1000.0, "ms"),
    ):
        if stats is None:
            table.add_row(f"{name} ({unit})", "-", "-", "-", "-")
            continue
        cells = [f"{getattr(stats, k) * scale:.4f}" for k in ("min", "median", "max", "p90")]
        table.add_row(f"{name} ({unit})", *cells)
    console = Console()
    console.print(table)
    console.print(
        f"requests {summary.num_requests - summary.num_failed}/{summary.num_requests} ok in "
        f"{summary.wall_seconds:.2f} s | {summary.request_throughput:.3f} req/s | input "
        f"{summary.input_throughput:.1f} tok/s | output {summary.output_throughput:.1f} tok/s | "
        f"total {summary.total_throughput:.1f} tok/s"
    )
    for error in summary.errors:
        console.print(f"[red]error:[/red] {error}")


def _parse_targets(urls: list[str], label: str | None) -> list[tuple[str, str]]:
    """``--url`` values as (label, url); ``name=http://...`` names a server, else its URL does."""
    if not urls:
        raise BenchServeError("give at least one --url, e.g. --url http://127.0.0.1:30000")
    if label is not None and len(urls) > 1:
        raise BenchServeError("--label names a single server; with several --url use name=http://... instead")
    targets = []
    for raw in urls:
        name, sep, url = raw.partition("=")
        if not sep or "://" in name:
            name, url = (label or raw), raw
        connection(url, 1.0)  # validates the URL's shape before anything runs
        targets.append((name, url))
    names = [name for name, _ in targets]
    if len(set(names)) != len(names):
        raise BenchServeError(f"--url labels must be distinct, got {names}")
    return targets


def _rank_idle(rank: int, idle_s: float, fraction: float) -> str:
    return f"r{rank} {idle_s * 1e3:.0f} ms {fraction:.0%}"


def _idle_cell(run: dict[str, Any]) -> str:
    """Per rank: median replayed prefill idle (ms) and its share of the makespan."""
    spread = (run.get("pipeline") or {}).get("idle_spread") or []
    cells = [_rank_idle(r["rank"], r["idle_s"]["median"], r["idle_fraction"]["median"]) for r in spread]
    return " | ".join(cells) or "-"


def _makespan_cell(run: dict[str, Any]) -> str:
    """Replayed prefill makespan: median [min-max] over repeats, and the min-cost replay's."""
    pipeline = run.get("pipeline") or {}
    values = pipeline.get("replayed_makespan_s") or []
    if not values:
        return "-"
    cell = f"{statistics.median(values):.3f}" + (f" [{min(values):.3f}-{max(values):.3f}]" if len(values) > 1 else "")
    min_cost = pipeline.get("min_cost_makespan_s")
    return cell + (f" (min-cost {min_cost:.3f})" if min_cost is not None else "")


def _min_cost_cell(run: dict[str, Any]) -> str:
    """Per rank: idle (ms) of the min-cost replay, or - when repeats are not comparable."""
    min_cost = (run.get("pipeline") or {}).get("min_cost") or {}
    cells = [_rank_idle(r["rank"], r["idle_s"], r["idle_fraction"]) for r in min_cost.get("ranks", [])]
    return " | ".join(cells) or "-"


def _print_side_by_side(runs: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    with_idle = any(run.get("pipeline") for run in runs)
    table = Table(title="bench-serve: servers side by side (same workload, run one after another)")
    columns = ["server", "ok", "TTFT median s", "TTFT p90 s", "latency median s", "total tok/s", "output tok/s"]
    if with_idle:
        columns += ["replayed makespan s", "prefill idle per rank (replayed, median)", "min-cost replay"]
    for column in columns:
        table.add_column(column, justify="left" if column == "server" or column.startswith(("prefill", "min-cost")) else "right")
    for run in runs:
        summary: Summary = run["summary_obj"]

        def cell(stats: Stats | None, key: str) -> str:
            return "-" if stats is None else f"{getattr(stats, key):.4f}"

        row = [
            run["label"], f"{summary.num_requests - summary.num_failed}/{summary.num_requests}",
            cell(summary.ttft, "median"), cell(summary.ttft, "p90"), cell(summary.latency, "median"),
            f"{summary.total_throughput:.1f}", f"{summary.output_throughput:.1f}",
        ]  # fmt: skip
        if with_idle:
            row += [_makespan_cell(run), _idle_cell(run), _min_cost_cell(run)]
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print("Wall-clock numbers of servers sharing one small machine are not a pipeline speedup claim.")
    if with_idle:
        console.print(
            "Prefill idle per rank: each stage compute's thread CPU time replayed as if every rank had its own "
            "device (transfers cost 0); a derived timeline, not a wall-clock measurement. Min-cost replay: each "
            "compute's minimum CPU time over the repeats, replayed once (interference only adds time)."
        )
    for run in runs:
        for note in run.get("notes") or []:
            console.print(f"[yellow]note ({run['label']}):[/yellow] {note}")


@user_errors
def bench_serve(
    url: Optional[list[str]] = typer.Option(None, "--url", help="Server base URL, e.g. http://127.0.0.1:30000; repeat as name=URL to compare servers side by side."),
    launch: Optional[str] = typer.Option(None, "--launch", help="Instead of --url: start one server per --pp-mode in turn (e.g. cpp,vpp-pack or all) and compare them, with per-rank prefill idle."),
    model_path: Optional[str] = typer.Option(None, "--model-path", help="--launch: the model (default: a tiny 8-layer Qwen2 built locally)."),
    pp_size: int = typer.Option(2, "--pp-size", help="--launch: pipeline ranks."),
    chunked_prefill_size: str = typer.Option("64", "--chunked-prefill-size", help="--launch: the chunk size (dcpp: its base chunk); 64, 1k, ..."),
    device: str = typer.Option("cpu", "--device", help="--launch: SGLang --device (cpu adds torch_native attention and fp32)."),
    server_arg: Optional[list[str]] = typer.Option(None, "--server-arg", help="--launch: one more launch_server argument, repeatable (e.g. --server-arg=--max-total-tokens --server-arg=32768)."),
    repeats: int = typer.Option(1, "--repeats", help="--launch: measured runs of the workload per server (idle spread is over repeats)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="--launch: where server logs and traces go (default: a new temporary directory)."),
    startup_timeout: float = typer.Option(600.0, "--startup-timeout", help="--launch: seconds a server may take to become healthy."),
    port: Optional[int] = typer.Option(None, "--port", help="--launch: the first server's port; the next mode gets the next port (default: free ports)."),
    workload: Workload = typer.Option(Workload.SHORT, "--workload", help="long, short, mixed or file."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", help="Requests to measure (workload default)."),
    input_len: Optional[str] = typer.Option(None, "--input-len", help="Input tokens (median for mixed): 1024, 8k, ..."),
    output_len: Optional[str] = typer.Option(None, "--output-len", help="Output tokens per request."),
    max_input_len: Optional[str] = typer.Option(None, "--max-input-len", help="mixed: clip lengths (default 12x --input-len)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Requests in flight at most (workload default)."),
    request_rate: float = typer.Option(math.inf, "--request-rate", help="Poisson arrivals per second (default: all at once)."),
    file: Optional[Path] = typer.Option(None, "--file", help="JSONL workload for --workload file."),
    vocab_size: int = typer.Option(10000, "--vocab-size", help="Random token ids are drawn below this."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload and the arrivals."),
    warmup: int = typer.Option(1, "--warmup", help="Requests sent (and not measured) before the run."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds one request may take."),
    label: Optional[str] = typer.Option(None, "--label", help="Name of this run in the table and JSON (e.g. the pp mode)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write config, server info, summary and per-request results."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG of TTFT, latency and time per output token per server (one box per server, a dot per request)."),
    output_file: Optional[Path] = typer.Option(None, "--output-file", help="Append one JSON line per server run, tagged with its configuration (pp-mode, pp/tp size, chunk size, layer split, SGLang version, device)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
) -> None:
    """Measure TTFT (streaming), end-to-end latency and throughput of SGLang servers.

    With several --url (e.g. --url cpp=http://127.0.0.1:30000 --url vpp-pack=http://127.0.0.1:30001)
    the same workload runs against each in turn and a side-by-side table follows. With --launch
    MODES the command starts each server itself (one at a time), adds each rank's prefill idle
    (replayed from per-stage CPU time, see docs/cli.md) and stops it again.
    """
    if (url is None) == (launch is None):
        raise BenchServeError("give either --url (running servers) or --launch MODES (start them), not both or neither")
    at_least(num_requests, 1, "--num-requests")
    at_least(concurrency, 1, "--concurrency")
    at_least(warmup, 0, "--warmup")
    at_least(repeats, 1, "--repeats")
    at_least(pp_size, 1, "--pp-size")
    at_least(vocab_size, FIRST_TOKEN_ID + 1, "--vocab-size")
    positive(request_rate, "--request-rate")
    positive(timeout, "--timeout")
    positive(startup_timeout, "--startup-timeout")
    check_output_path(json_out, "--json")
    check_output_path(output_file, "--output-file")
    check_output_path(plot, "--plot")
    sizes = {flag: parse_size_option(text, flag) for flag, text in (
        ("--input-len", input_len), ("--output-len", output_len), ("--max-input-len", max_input_len),
        ("--chunked-prefill-size", chunked_prefill_size))}  # fmt: skip
    default_num, default_in, default_out, default_conc = WORKLOAD_DEFAULTS[workload]

    def given(value: int | None, default: int) -> int:
        return default if value is None else value

    plan = RunPlan(
        workload=workload, num_requests=given(num_requests, default_num),
        input_len=given(sizes["--input-len"], default_in), output_len=given(sizes["--output-len"], default_out),
        concurrency=given(concurrency, default_conc), request_rate=request_rate, timeout=timeout, seed=seed,
        warmup=warmup, vocab_size=vocab_size, max_input_len=sizes["--max-input-len"], file=file, progress=progress,
    )  # fmt: skip
    modes = None
    if launch is not None:
        from .bench_serve_launch import check_can_launch, parse_modes

        modes = parse_modes(launch)
        if port is not None and not 0 < port <= 65536 - len(modes):
            raise BenchServeError(f"--port {port}: {len(modes)} server(s) need ports {port}..{port + len(modes) - 1}, "
                                  "all in 1..65535")
        check_can_launch()  # SGLang and transformers, before the default model is built
    else:
        _parse_targets(url, label)  # every --url checked before any request
    config = plan.describe()  # also validates the workload before anything runs
    if launch is not None:
        from .bench_serve_launch import LaunchSpec, default_model_dir

        spec = LaunchSpec(
            model_dir=model_path or default_model_dir(), pp_size=pp_size,
            chunked_prefill_size=sizes["--chunked-prefill-size"], device=device, server_args=tuple(server_arg or ()),
            startup_timeout=startup_timeout, work_dir=work_dir, first_port=port or 0,
        )  # fmt: skip
        _bench_launched(modes, spec, plan, config, repeats, json_out, output_file, plot)
        return
    runs = []
    for name, target in _parse_targets(url, label):
        plan.warm_up(target)
        summary, results = plan.run(target)
        _print_summary(summary, name if (label is not None or len(url) > 1) else None)
        runs.append({
            "label": name if (label is not None or len(url) > 1) else label, "url": target, "config": config,
            "server": server_info(target, 10.0), "summary": asdict(summary),
            "requests": [asdict(r) for r in results], "summary_obj": summary,
        })  # fmt: skip
    if len(runs) > 1:
        _print_side_by_side(runs)
    if json_out is not None:
        clean = [{k: v for k, v in run.items() if k != "summary_obj"} for run in runs]
        emit_json(clean[0] if len(clean) == 1 else {"runs": clean}, json_out)
    if output_file is not None:
        from sglang_vpp.serving.results import append_results, sglang_version

        append_results(output_file, runs, [{**run["server"], "sglang_version": sglang_version()} for run in runs])
    if plot is not None:
        _write_plot(runs, plot)
    if any(run["summary_obj"].num_failed for run in runs):
        raise typer.Exit(1)


def _launch_verdicts(launched: list) -> list:
    """Each mode vs cpp and dcpp (when launched) on the replayed prefill makespan and the served
    median TTFT, per repeat. Servers run one after another: unpaired, ranges must not overlap."""
    from sglang_vpp.verdict import make_verdict

    verdicts = []
    makespans = {run.mode: run.replayed_makespans() for run in launched}
    if all(makespans.values()):
        verdicts.append(make_verdict(makespans, "replayed prefill makespan", paired=False))
    ttfts = {run.mode: [s.ttft.median for s in run.summaries if s.ttft is not None] for run in launched}
    if all(ttfts.values()):
        verdicts.append(make_verdict(ttfts, "served TTFT median (wall clock, shared host)", paired=False))
    return verdicts


def _write_plot(runs: list[dict[str, Any]], path: Path) -> None:
    """TTFT / latency / time-per-output-token distribution of every server run (``serving/plots.py``)."""
    from sglang_vpp.serving.plots import write_distribution_plot

    def values(run: dict[str, Any], key: str) -> list[float]:
        return [r[key] for r in run["requests"] if r.get("ok") and r.get(key) is not None]

    def per_token(run: dict[str, Any]) -> list[float]:
        return [(r["latency"] - r["ttft"]) / (r["output_tokens"] - 1) for r in run["requests"]
                if r.get("ok") and r.get("ttft") is not None and r.get("latency") is not None and r["output_tokens"] > 1]

    labels = [str(run["label"] or run["url"]) for run in runs]
    write_distribution_plot({
        "TTFT": {label: values(run, "ttft") for label, run in zip(labels, runs)},
        "end-to-end latency": {label: values(run, "latency") for label, run in zip(labels, runs)},
        "time per output token": {label: per_token(run) for label, run in zip(labels, runs)},
    }, path, title="bench-serve: per-request times (wall clock on this host)")
    typer.echo(f"wrote {path}")


def _bench_launched(modes: list[str], spec, plan: RunPlan, config: dict[str, Any], repeats: int,
                    json_out: Path | None, output_file: Path | None = None, plot: Path | None = None) -> None:
    """--launch: one server per mode, measured in turn (bench_serve_launch.run_launched)."""
    from rich.console import Console

    from .bench_serve_launch import run_launched

    from sglang_vpp.serving.launcher import ServerStartError
    from sglang_vpp.serving.pipeline_report import TraceUnavailableError

    console = Console(stderr=True)
    status = console.status("", spinner="dots")

    def waiting(mode: str, elapsed: float, last_line: str) -> None:
        status.update(f"--pp-mode {mode}: starting, {elapsed:.0f} s | {last_line[-100:]}")
        if not plan.progress:
            return
        status.start()

    def event(text: str) -> None:
        status.stop()
        console.print(f"[dim]{text}[/dim]")

    try:
        launched = run_launched(
            spec, modes, repeats=repeats, warm_up=plan.warm_up, run_once=plan.run, on_event=event, on_wait=waiting,
        )  # fmt: skip
    except (ServerStartError, TraceUnavailableError) as error:
        status.stop()
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    status.stop()
    runs = []
    for run in launched:
        min_cost = run.min_cost_idle()
        # Over all repeats: the spread of TTFT / latency covers every measured request.
        summary = summarize([r for results in run.results for r in results], sum(s.wall_seconds for s in run.summaries))
        _print_summary(summary, run.mode)
        launch_facts = {
            "mode": run.mode, "model_path": spec.model_dir, "pp_size": spec.pp_size,
            "chunked_prefill_size": spec.chunked_prefill_size, "device": spec.device,
            "server_args": list(spec.server_args), "repeats": repeats, "log": run.log_path,
            "start_seconds": run.start_seconds,
        }  # fmt: skip
        runs.append({
            "label": run.mode, "url": run.url, "config": {**config, "launch": launch_facts},
            "summary": asdict(summary), "requests": [asdict(r) for results in run.results for r in results],
            "repeats": [asdict(s) for s in run.summaries],
            "pipeline": {
                "per_repeat": [idle.to_json() for idle in run.idle], "idle_spread": run.idle_spread(),
                "replayed_makespan_s": run.replayed_makespans(),
                "min_cost": min_cost.to_json() if min_cost is not None else None,
                "min_cost_makespan_s": max((r.makespan_s for r in min_cost.ranks), default=None)
                if min_cost is not None else None,
            },
            "notes": run.notes, "summary_obj": summary,
        })  # fmt: skip
    _print_side_by_side(runs)
    verdicts = _launch_verdicts(launched)
    for verdict in verdicts:
        typer.echo("\n".join(verdict.lines()))
    if json_out is not None:
        emit_json({"runs": [{k: v for k, v in r.items() if k != "summary_obj"} for r in runs],
                   "verdicts": [v.to_dict() for v in verdicts]}, json_out)
    if output_file is not None:
        from sglang_vpp.serving.results import append_results, launch_tags

        append_results(output_file, runs, [launch_tags(run.mode, spec.pp_size, spec.chunked_prefill_size, spec.device,
                                                       spec.server_args) for run in launched])
    if plot is not None:
        _write_plot(runs, plot)
    if any(s.num_failed for run in launched for s in run.summaries):
        raise typer.Exit(1)
