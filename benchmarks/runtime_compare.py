"""Full runtime comparison: tiny-qwen3, 16K and 32K tokens, 1K chunks, 3 repeats, all five modes.

Runs ``sglang_vpp.runtime.bench.run_bench`` per length (real rank processes, gloo, CPU; each mode
checked against the single-process reference), then:

1. the **replayed** (dedicated-hardware) makespan and bubble ratio of every run;
2. the **simulator's prediction** of each run from a fitted cost model of a *different* run:
   ``FittedCostModel`` fitted on the same mode's samples of the next repeat (same length), and,
   as a harder check, a per-layer fit on the other length's runs (all modes pooled);
   error = predicted / replayed makespan - 1, per run and per mode;
3. where vpp-pack's replayed bubble ratio is not well under cpp's, it says so.

Output: ``docs/runtime-results.md`` (the table), ``docs/figures/runtime_<len>.png`` / ``.trace.json``
(measured and replayed timelines of the last repeat) and ``benchmarks/results/runtime_compare.json``.

Usage: ``python benchmarks/runtime_compare.py [--lengths 16k,32k] [--chunk 1k] [--repeat 3]``
(about 20 CPU-minutes at the defaults; wall time depends on how loaded the host is).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from sglang_vpp.runtime.bench import (
    BenchConfig,
    BenchProgress,
    BenchReport,
    run_bench,
    write_outputs,
)
from sglang_vpp.runtime.replay import replay_samples
from sglang_vpp.runtime.spec import Timeouts
from sglang_vpp.schedule import parse_size
from sglang_vpp.sim import SimConfig, simulate_schedule
from sglang_vpp.sim.cost.fitted import FittedCostModel

MODES = ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack")


class _Log(BenchProgress):
    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()

    def phase(self, text: str) -> None:
        print(f"[{self.label} {time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    def run_finished(self, mode: str, repeat: int, m) -> None:
        print(f"[{self.label} {time.monotonic() - self.started:7.1f}s] {mode} repeat {repeat + 1}: "
              f"diff {m.max_abs_diff:.1e}, wall {m.measured.makespan_s:.2f}s, replay "
              f"{m.replay.result.makespan_s:.2f}s, replay bubble {m.replay.result.bubble_ratio:.1%}", flush=True)


def _fit(samples) -> FittedCostModel:
    return FittedCostModel.fit(replay_samples(samples))


def _per_layer(samples) -> FittedCostModel:
    fitted = FittedCostModel.fit(replay_samples(samples))
    return FittedCostModel({}, fitted.per_layer, fitted.transfer)


def predictions(report: BenchReport, other: BenchReport | None) -> list[dict]:
    """Per run: replayed makespan, the simulator's prediction from another run's fit, the error."""
    rows = []
    repeats = report.config.repeat
    pooled_other = _per_layer([s for run in other.runs for s in run.replay.samples]) if other else None
    for run in report.runs:
        replayed = run.replay.result.makespan_s
        row = {"mode": run.mode, "repeat": run.repeat, "replay_makespan_s": replayed}
        models = {}
        if repeats > 1:  # a single repeat has no other run of the same mode to fit on
            donor = next(r for r in report.runs if r.mode == run.mode and r.repeat == (run.repeat + 1) % repeats)
            models["same_mode_other_repeat"] = _fit(donor.replay.samples)
        if pooled_other is not None:
            models["other_length_per_layer"] = pooled_other
        for name, model in models.items():
            arrivals = dict(enumerate(a.arrival for a in run.replay.schedule.requests))
            sim = simulate_schedule(run.replay.schedule, model, SimConfig(record_timeline=False), arrivals=arrivals)
            row[f"{name}_s"] = sim.makespan_s
            row[f"{name}_error"] = sim.makespan_s / replayed - 1
        rows.append(row)
    return rows


def _median_span(values: list[float], fmt: str = "{:.2f}") -> str:
    text = fmt.format(statistics.median(values))
    return text if len(values) == 1 else f"{text} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def markdown(reports: dict[int, BenchReport], preds: dict[int, list[dict]], wall_s: float, tag: str = "") -> str:
    first = next(iter(reports.values())).config
    lines = [
        "# Reference runtime results (`benchmarks/runtime_compare.py`)",
        "",
        f"Model `{first.model}` (hidden 64, 8 layers, GQA 4/2 heads, fp32), pp={first.num_ranks}, gloo on CPU, "
        f"{first.num_requests} request(s) per run, chunk {first.chunk_size} tokens, {first.repeat} repeats per "
        f"mode and length. Generated in {wall_s / 60:.0f} min on a shared 2-vCPU host.",
        "",
        "Read this first: **wall** is the measured wall clock on this host, where the ranks share two vCPUs",
        "with each other and with other jobs; it is not a speedup measurement. **replay** is the executed",
        "action order of each run re-timed with that run's own measured per-action costs (thread CPU time",
        "per compute; least contended transfer per message size): the timeline the run would have with a",
        "dedicated core per rank (docs/runtime.md). Cells: median (min-max) over repeats.",
        "",
    ]
    for length, report in reports.items():
        lines += [f"## {length // 1024}K tokens", "",
                  "| mode | max abs diff | chunks | wall s | replay makespan s | replay bubble | wall bubble | "
                  "compute s / rank | replay exposed comm s | predicted s (other repeat) | error | "
                  "predicted s (other length) | error |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        rows = {m: [p for p in preds[length] if p["mode"] == m] for m in report.config.modes}
        for summary in report.modes:
            mode_preds = rows[summary.mode]
            same = [p["same_mode_other_repeat_s"] for p in mode_preds if "same_mode_other_repeat_s" in p]
            same_err = [p["same_mode_other_repeat_error"] for p in mode_preds if "same_mode_other_repeat_s" in p]
            cross = [p.get("other_length_per_layer_s") for p in mode_preds if "other_length_per_layer_s" in p]
            cross_err = [p["other_length_per_layer_error"] for p in mode_preds if "other_length_per_layer_error" in p]
            lines.append(
                f"| {summary.mode} | {summary.max_abs_diff:.1e} | {summary.num_chunks} | {_median_span(summary.wall_s)} | "
                f"{_median_span(summary.replay_makespan_s)} | "
                f"{_median_span(summary.replay_bubble_ratio_runs, '{:.1%}')} | "
                f"{_median_span(summary.bubble_ratio_runs, '{:.1%}')} | {summary.compute_s:.2f} | "
                f"{summary.replay_exposed_comm_s:.3f} | "
                + (f"{_median_span(same)} | {_median_span(same_err, '{:+.1%}')} | " if same else "- | - | ")
                + (f"{_median_span(cross)} | {_median_span(cross_err, '{:+.1%}')} |" if cross else "- | - |"))
        lines += ["", *_verdicts(report), ""]
    errors = [abs(p[k]) for rows in preds.values() for p in rows for k in p if k.endswith("other_repeat_error")]
    worst = max(errors, default=float("nan"))
    lines += [
        "## Replay vs simulator prediction",
        "",
        "The prediction simulates the same schedule with `sim.FittedCostModel` "
        "(`f(c, L) = a c (c + L) + b (c + L) + d` per stage) fitted on the samples of a **different run**: "
        "the same mode's next repeat (column *other repeat*), and a per-layer fit of every mode at the "
        "other length (column *other length*). Error = predicted / replayed makespan - 1.",
        f"Largest absolute error, other-repeat fit, over all runs: {worst:.1%}"
        + (" (within the 10% target)." if worst <= 0.10 else " (**outside the 10% target**; see the rows above)."),
        "",
        f"Figures: `docs/figures/runtime_<len>k{'_' + tag if tag else ''}.png` (Gantt: measured and replayed "
        f"timeline of each mode, last repeat) and `docs/figures/runtime_<len>k{'_' + tag if tag else ''}.trace.json` "
        "(open in ui.perfetto.dev).",
    ]
    return "\n".join(lines) + "\n"


def _verdicts(report: BenchReport) -> list[str]:
    by_mode = {m.mode: m for m in report.modes}
    if "cpp" not in by_mode or "vpp-pack" not in by_mode:
        return []
    cpp = statistics.median(by_mode["cpp"].replay_bubble_ratio_runs)
    out = []
    for mode in ("vpp", "vpp-async", "vpp-pack", "dcpp"):
        if mode not in by_mode:
            continue
        ratio = statistics.median(by_mode[mode].replay_bubble_ratio_runs)
        verdict = "well under" if ratio < 0.75 * cpp else ("under" if ratio < cpp else "**not under**")
        out.append(f"- {mode}: replayed bubble ratio {ratio:.1%} is {verdict} cpp's {cpp:.1%}.")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16k,32k")
    parser.add_argument("--chunk", default="1k")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--tag", default="", help="Suffix of the figure and result file names.")
    parser.add_argument("--out", default=str(ROOT / "docs" / "runtime-results.md"))
    args = parser.parse_args(argv)
    lengths = [parse_size(x) for x in args.lengths.split(",")]
    figures = ROOT / "docs" / "figures"
    results_dir = ROOT / "benchmarks" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    reports: dict[int, BenchReport] = {}
    # Long computes on a loaded host: generous waits (a wait only ends early when something failed).
    timeouts = Timeouts(comm_s=600.0, control_s=900.0, startup_s=600.0, run_s=7200.0)
    for length in lengths:
        config = BenchConfig(model=args.model, seq_len=length, chunk_size=parse_size(args.chunk), modes=MODES,
                             num_requests=args.requests, repeat=args.repeat, timeouts=timeouts)
        report = run_bench(config, _Log(f"{length // 1024}k"))
        reports[length] = report
        stem = f"runtime_{length // 1024}k{'_' + args.tag if args.tag else ''}"
        write_outputs(report, results_dir / f"{stem}.json", figures / f"{stem}.trace.json", figures / f"{stem}.png",
                      results_dir / f"{stem}_costs.json")
    preds = {}
    for length, report in reports.items():
        others = [r for l, r in reports.items() if l != length]
        preds[length] = predictions(report, others[0] if others else None)
    wall = time.monotonic() - started
    Path(args.out).write_text(markdown(reports, preds, wall, args.tag))
    (results_dir / f"runtime_compare{'_' + args.tag if args.tag else ''}.json").write_text(json.dumps(
        {str(l): {"results": r.to_json()["results"], "predictions": preds[l]} for l, r in reports.items()}, indent=1))
    print(Path(args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
