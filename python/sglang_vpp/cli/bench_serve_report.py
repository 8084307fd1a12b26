"""bench-serve's output side: ``--launch`` runs per mode, tables, verdict, JSON, tagged JSONL, plots."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from sglang_vpp.serving.bench_serving import (
    LoadPlan,
    ServingPass,
    check_fits_context,
    merge_passes,
    run_pass,
    server_context_len,
)

from .common import emit_json

__all__ = ["bench_launched", "finish", "run_entry"]

WARMUP_SEED_OFFSET = 1000
"""Warm-up prompts use seed + this, so no measured prompt is already in the prefix cache."""


def gantt_path(plot: Path) -> Path:
    """Where ``--launch`` puts the per-rank Gantt next to the ``--plot`` PNG."""
    return plot.with_name(plot.stem + "-gantt" + plot.suffix)


def run_entry(label: str, url: str, config: dict[str, Any], passes: list[ServingPass]) -> dict[str, Any]:
    """One server's entry of the JSON output (and of the tagged lines): its passes merged."""
    return {
        "label": label, "url": url, "config": config, "summary": merge_passes(passes),
        "repeats": [p.metrics for p in passes], "ttfts": [t for p in passes for t in p.ttfts],
        "itls": [x for p in passes for x in p.itls], "errors": [e for p in passes for e in p.errors],
        "bench_serving_jsonl": passes[0].output_file if passes else None,
    }  # fmt: skip


def _url_tags(run: dict[str, Any]) -> dict[str, Any]:
    """Tags of a --url server, from the /server_info bench_serving recorded with its results."""
    from sglang_vpp.serving.results import sglang_version

    info = next((m.get("server_info") for m in run.get("repeats") or [] if m.get("server_info")), None) or {}
    split = info.get("vpp_layer_split")
    return {"pp_mode": info.get("pp_mode"), "pp_size": info.get("pp_size"), "tp_size": info.get("tp_size"),
            "chunked_prefill_size": info.get("chunked_prefill_size"),
            "layer_split": split if isinstance(split, list) else None, "fold": info.get("vpp_fold") or "split",
            "sglang_version": info.get("version") or sglang_version(), "device": info.get("device")}


NO_VERDICT = ("no verdict: some requests failed (above), and a failed request is not a served one; fix the "
              "load or the server, or pass --allow-failures to compare the requests that were served")


def finish(runs: list[dict[str, Any]], document: dict[str, Any], verdicts: list, json_out: Path | None,
           output_file: Path | None, plot: Path | None, fmt: str, tags: list[dict[str, Any]],
           spans: dict[str, Any] | None = None, *, notes: list[str] = (), allow_failures: bool = False,
           work_dir: Path | None = None) -> None:
    """Print (``--format``), write JSON, tagged lines and plots. A run in which any request failed
    gets no verdict and exits 1, unless ``allow_failures``."""
    from sglang_vpp.serving.report import render_tables, wrap
    from sglang_vpp.serving.results import append_results

    failed = any(run["summary"]["num_failed"] for run in runs)
    if failed and not allow_failures:
        verdicts = []
        if "verdicts" in document:
            document["verdicts"] = []
            document["no_verdict"] = NO_VERDICT
    # With --format json or --json - the JSON owns stdout: everything for people goes to stderr,
    # so that stdout parses as one JSON document.
    json_stdout = json_out is not None and str(json_out) == "-"
    to_stderr = fmt == "json" or json_stdout
    if fmt == "json":
        emit_json(document)
    else:
        typer.echo(render_tables(runs, fmt, notes), err=to_stderr)
        if failed and not allow_failures:
            typer.echo(wrap(NO_VERDICT), err=to_stderr)
        elif failed and verdicts:
            typer.echo(wrap("--allow-failures: the verdicts compare the requests that were served"), err=to_stderr)
        for verdict in verdicts:
            typer.echo("\n".join(verdict.lines()), err=to_stderr)
    if json_out is not None and not (json_stdout and fmt == "json"):
        emit_json(document, json_out)
    if output_file is not None:
        append_results(output_file, runs, [tag if "pp_mode" in tag else _url_tags(run) for run, tag in zip(runs, tags)])
    if plot is not None:
        from sglang_vpp.serving.plots import write_distribution_plot, write_rank_gantt

        labels = [str(run["label"] or run["url"]) for run in runs]

        def ok(run: dict[str, Any], values: list) -> list:
            return [v for v, e in zip(values, run["errors"]) if not e]

        write_distribution_plot({
            "TTFT": {label: ok(run, run["ttfts"]) for label, run in zip(labels, runs)},
            "ITL (inter-token latency)": {label: [x for itl in ok(run, run["itls"]) for x in itl]
                                          for label, run in zip(labels, runs)},
            "E2E latency": {label: [t + sum(i) for t, i in zip(ok(run, run["ttfts"]), ok(run, run["itls"]))]
                            for label, run in zip(labels, runs)},
        }, plot, title="bench-serve: per-request times from bench_serving (wall clock on this host)")  # fmt: skip
        typer.echo(f"wrote {plot}", err=to_stderr)
        if spans:
            gantt = gantt_path(plot)
            write_rank_gantt(spans, gantt, title="bench-serve: first measured repeat, equal-cost replayed prefill")
            typer.echo(f"wrote {gantt}", err=to_stderr)
    if work_dir is not None:
        typer.echo(f"work dir (logs, traces, JSONL): {work_dir}", err=to_stderr)
    if failed and not allow_failures:
        raise typer.Exit(1)


PIPELINE_METRIC = "equal-cost prefill makespan (one cost model for all modes)"
SERVED_METRIC = "each pass's median served TTFT (wall clock, shared host)"


def _layouts(modes: list[str], spec) -> dict[str, Any] | None:
    """Each mode's layer layout (the shared cost model counts layers per stage); None when the
    model's layer count cannot be read here."""
    from sglang_vpp.schedule import policy_layout
    from sglang_vpp.serving.results import option_value
    from sglang_vpp.sglang_plugin.validate import model_num_layers

    num_layers = model_num_layers(spec.model_dir)
    if num_layers is None:
        return None
    split = option_value(spec.server_args, "--vpp-layer-split")
    fold = option_value(spec.server_args, "--vpp-fold") or "split"
    layouts = {}
    for mode in modes:
        own = [int(x) for x in split.split(",")] if split and mode.startswith("vpp") else None
        layouts[mode] = policy_layout(mode, spec.pp_size, num_layers, own, fold)
    return layouts


def _launch_verdicts(launched: list, equal_cost: dict[str, list]) -> list:
    """Each mode vs cpp and dcpp (when launched) on two metrics, each per repeat:

    - the equal-cost prefill makespan (every mode's executed prefill re-timed on one cost model
      shared by all modes, as ``bench``'s verdict: only the schedules differ), paired by repeat;
    - the served median TTFT (wall clock): servers ran one after another, so unpaired, and the
      ranges must not overlap."""
    from sglang_vpp.verdict import make_verdict

    verdicts = []
    makespans = {mode: [max(r.makespan_s for r in idle.ranks) for idle in runs] for mode, runs in equal_cost.items()}
    if makespans and all(makespans.values()):
        verdicts.append(make_verdict(makespans, PIPELINE_METRIC, paired=True, repeat_flag="--repeats"))
    ttfts = {run.mode: [p.metrics["median_ttft_ms"] / 1e3 for p in run.passes if p.metrics.get("median_ttft_ms")]
             for run in launched}
    if all(ttfts.values()):
        # Per pass, not the table's pooled median: the ranges must be over repeats.
        verdicts.append(make_verdict(ttfts, SERVED_METRIC, paired=False, repeat_flag="--repeats"))
    return verdicts


def _spread(values: list[float]) -> dict[str, float]:
    import statistics

    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def bench_launched(modes: list[str], spec, plan: LoadPlan, repeats: int, out_dir: Path, json_out: Path | None,
                   output_file: Path | None, plot: Path | None, fmt: str, allow_failures: bool = False) -> None:
    """--launch: one server per mode, bench_serving passes against each (bench_serve_launch.run_launched)."""
    from rich.console import Console

    from sglang_vpp.serving.bench_worker import BenchServingWorker
    from sglang_vpp.serving.host_time import host_spread
    from sglang_vpp.serving.launcher import ServerStartError
    from sglang_vpp.serving.pipeline_report import TraceUnavailableError
    from sglang_vpp.serving.results import launch_tags

    from .bench_serve_launch import run_launched, starting_mode

    console = Console(stderr=True)
    status = console.status("", spinner="dots")
    plain_progress = plan.progress and not sys.stderr.isatty()
    last_shown = [-1.0]

    def waiting(mode: str, elapsed: float, last_line: str) -> None:
        if not plan.progress:
            return
        text = f"--pp-mode {mode}: starting, {elapsed:.0f} s | {last_line.strip()}"[:79]
        if plain_progress:  # no live status line in a log: one line every 15 s
            if elapsed - last_shown[0] >= 15:
                last_shown[0] = elapsed
                console.print(text, highlight=False)
            return
        status.update(text)
        status.start()

    def event(text: str) -> None:
        status.stop()
        last_shown[0] = -1.0
        if fmt != "json":
            console.print(f"[dim]{text}[/dim]")

    def jsonl(mode: str) -> tuple[Path, Path]:
        return out_dir / f"bench-serving-{mode}.jsonl", out_dir / f"bench-serving-{mode}.log"

    worker = BenchServingWorker()  # every pass against every mode's server runs in it
    _current = [modes[0]]  # the mode whose server is up (set from run_launched's events)

    def warm_up(url: str) -> int:
        check_fits_context(plan, url, server_context_len(url))  # before any request is sent
        if plan.warmup <= 0:
            return 0
        out, log = jsonl(_current[0])
        run_pass(plan, url, out.with_name(out.stem + "-warmup.jsonl"), log, seed_offset=WARMUP_SEED_OFFSET,
                 num_requests=plan.warmup, warmup=0, paced=False, worker=worker)  # fmt: skip
        return plan.warmup

    def run_once(url: str, repeat: int):
        out, log = jsonl(_current[0])
        return run_pass(plan, url, out, log, seed_offset=repeat, warmup=0, worker=worker)

    def on_event(text: str) -> None:
        started = starting_mode(text, modes)
        if started is not None:
            _current[0] = started
        event(text)

    try:
        with worker:
            launched = run_launched(spec, modes, repeats=repeats, warm_up=warm_up, run_once=run_once,
                                    on_event=on_event, on_wait=waiting)  # fmt: skip
    except (ServerStartError, TraceUnavailableError) as error:
        status.stop()
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    status.stop()
    from sglang_vpp.serving.pipeline_report import equal_cost_idle

    layouts = _layouts(modes, spec)
    equal_cost, models = equal_cost_idle({run.mode: run.idle for run in launched}, layouts) if layouts else ({}, [])
    runs, spans = [], {}
    for run in launched:
        min_cost = run.min_cost_idle()
        launch_facts = {
            "mode": run.mode, "model_path": spec.model_dir, "pp_size": spec.pp_size,
            "chunked_prefill_size": spec.chunked_prefill_size, "device": spec.device,
            "server_args": list(spec.server_args), "repeats": repeats, "log": run.log_path,
            "start_seconds": run.start_seconds,
        }  # fmt: skip
        entry = run_entry(run.mode, run.url, {**plan.describe(), "launch": launch_facts}, run.passes)
        entry["pipeline"] = {
            "per_repeat": [idle.to_json() for idle in run.idle], "idle_spread": run.idle_spread(),
            "replayed_makespan_s": run.replayed_makespans(),
            "min_cost": min_cost.to_json() if min_cost is not None else None,
            "min_cost_makespan_s": max((r.makespan_s for r in min_cost.ranks), default=None)
            if min_cost is not None else None,
        }  # fmt: skip
        entry["host_time"] = host_spread(run.host)
        shared = equal_cost.get(run.mode) or []
        if shared:
            entry["pipeline"]["equal_cost"] = {
                "method": shared[0].method, "per_repeat": [idle.to_json() for idle in shared],
                "makespan_s": [max(r.makespan_s for r in idle.ranks) for idle in shared],
                "idle_fraction": [_spread([idle.ranks[k].idle_fraction for idle in shared])
                                  for k in range(shared[0].num_ranks)],
            }  # fmt: skip
        entry["notes"] = run.notes if layouts else [*run.notes, f"{spec.model_dir}: layer count unknown here, so "
                                                    "no equal-cost replay (and no pipeline verdict)"]
        runs.append(entry)
        if shared:
            spans[run.mode] = shared[0].spans
    verdicts = _launch_verdicts(launched, equal_cost)
    document = {"runs": runs, "verdicts": [v.to_dict() for v in verdicts],
                "equal_cost_models": [model.to_dict() for model in models]}
    tags = [launch_tags(run.mode, spec.pp_size, spec.chunked_prefill_size, spec.device, spec.server_args)
            for run in launched]
    finish(runs, document, verdicts, json_out, output_file, plot, fmt, tags, spans, allow_failures=allow_failures,
           work_dir=out_dir)
