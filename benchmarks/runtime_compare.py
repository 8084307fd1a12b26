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
from sglang_vpp.runtime.replay import replay_cost, replay_samples
from sglang_vpp.runtime.spec import Timeouts
from sglang_vpp.schedule import parse_size
from sglang_vpp.sim import SimConfig, simulate_schedule
from sglang_vpp.schedule.fitted_cost import FittedCostModel
from sglang_vpp.sim.cost.fitted import fit_cost_model

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
    return fit_cost_model(replay_samples(samples))


def _per_layer(samples) -> FittedCostModel:
    fitted = fit_cost_model(replay_samples(samples))
    return FittedCostModel({}, fitted.per_layer, fitted.transfer)


def _donor(report: BenchReport, run):
    repeats = report.config.repeat
    return next(r for r in report.runs if r.mode == run.mode and r.repeat == (run.repeat + 1) % repeats)


def predictions(report: BenchReport, other: BenchReport | None) -> list[dict]:
    """Per run: replayed makespan and the simulator's predictions of it from *other* runs' costs.

    - ``fitted_other_repeat``: ``FittedCostModel`` (per stage) of the same mode's next repeat;
    - ``table_other_repeat``: the exact per-action costs of that repeat (separates run-to-run
      variation of the measured costs from the fitted form's error);
    - ``fitted_other_length``: a per-layer fit of every mode at the other length.
    """
    rows = []
    pooled_other = _per_layer([s for run in other.runs for s in run.replay.samples]) if other else None
    for run in report.runs:
        replayed = run.replay.result.makespan_s
        row = {"mode": run.mode, "repeat": run.repeat, "replay_makespan_s": replayed}
        models = {}
        if report.config.repeat > 1:  # a single repeat has no other run of the same mode
            donor = _donor(report, run)
            models["fitted_other_repeat"] = _fit(donor.replay.samples)
            models["table_other_repeat"] = replay_cost(donor.replay.samples)
        if pooled_other is not None:
            models["fitted_other_length"] = pooled_other
        for name, model in models.items():
            arrivals = dict(enumerate(a.arrival for a in run.replay.schedule.requests))
            sim = simulate_schedule(run.replay.schedule, model, SimConfig(record_timeline=False), arrivals=arrivals)
            row[f"{name}_s"] = sim.makespan_s
            row[f"{name}_error"] = sim.makespan_s / replayed - 1
        rows.append(row)
    return rows


def fit_diagnostics(report: BenchReport) -> dict[str, dict]:
    """Per mode: the other-repeat fit's relative error per compute, by prefix quartile, and on the
    sum of all computes (what drives the makespan error)."""
    out = {}
    if report.config.repeat < 2:
        return out
    for mode in report.config.modes:
        errors, predicted, measured = [], 0.0, 0.0
        for run in (r for r in report.runs if r.mode == mode):
            model = _fit(_donor(report, run).replay.samples)
            stages = run.replay.schedule.layout.stages
            chunks = {chunk.key: chunk for chunk in run.replay.schedule.chunks}  # batched forwards whole
            for sample in (x for x in run.replay.samples if x.kind == "compute"):
                chunk = chunks[(sample.request_index, sample.chunk_index)]
                guess = model.stage_cost(stages[sample.stage_index], chunk)
                errors.append((sample.prefix_tokens, guess / sample.duration_s - 1))
                predicted += guess
                measured += sample.duration_s
        errors.sort()
        quarter = max(1, len(errors) // 4)
        buckets = [errors[i * quarter: (i + 1) * quarter if i < 3 else len(errors)] for i in range(4)]
        out[mode] = {"quartiles": [statistics.fmean(e for _, e in b) if b else float("nan") for b in buckets],
                     "total": predicted / measured - 1}
    return out


def _median_span(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    text = fmt.format(statistics.median(values))
    return text if len(values) == 1 else f"{text} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def markdown(reports: dict[int, BenchReport], preds: dict[int, list[dict]], wall_s: float, tag: str = "") -> str:
    first = next(iter(reports.values())).config
    suffix = "_" + tag if tag else ""
    lines = [
        "# Reference runtime results (`benchmarks/runtime_compare.py`)",
        "",
        f"Model `{first.model}` (hidden 64, 8 layers, GQA 4/2 heads, fp32), pp={first.num_ranks}, gloo on CPU, "
        f"{first.num_requests} request(s) per run, chunk {first.chunk_size} tokens, {first.repeat} repeat(s) per "
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
                  "compute s / rank | replay exposed comm s | replay TTFT s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m in report.modes:
            lines.append(
                f"| {m.mode} | {m.max_abs_diff:.1e} | {m.num_chunks} | {_median_span(m.wall_s)} | "
                f"{_median_span(m.replay_makespan_s)} | {_median_span(m.replay_bubble_ratio_runs, '{:.1%}')} | "
                f"{_median_span(m.bubble_ratio_runs, '{:.1%}')} | {m.compute_s:.2f} | "
                f"{m.replay_exposed_comm_s:.3f} | {_median_span(m.replay_ttft_s)} |")
        lines += ["", *_verdicts(report), ""]
        lines += ["Verdict on the equal-cost replay (every mode's order on one shared cost model; "
                  "`docs/runtime.md`):", "", "```", *[line for v in report.verdicts() for line in v.lines()], "```", ""]
        lines += [f"Simulator predictions of the replayed makespan ({length // 1024}K): seconds, and error = "
                  "predicted / replayed - 1.", "",
                  "| mode | replayed s | fitted, other repeat | error | table, other repeat | error | "
                  "fitted per layer, other length | error |", "|---|---|---|---|---|---|---|---|"]
        for mode in report.config.modes:
            rows = [p for p in preds[length] if p["mode"] == mode]

            def col(key: str, fmt: str = "{:.2f}", rows: list[dict] = rows) -> str:
                return _median_span([p[key] for p in rows if key in p], fmt)

            lines.append(f"| {mode} | {col('replay_makespan_s')} | {col('fitted_other_repeat_s')} | "
                         f"{col('fitted_other_repeat_error', '{:+.1%}')} | {col('table_other_repeat_s')} | "
                         f"{col('table_other_repeat_error', '{:+.1%}')} | {col('fitted_other_length_s')} | "
                         f"{col('fitted_other_length_error', '{:+.1%}')} |")
        diagnostics = fit_diagnostics(report)
        if diagnostics:
            lines += ["", "Fitted model (other repeat) vs measured per compute: mean relative error by prefix "
                      "quartile, and on the sum of all computes.", "",
                      "| mode | prefix Q1 | Q2 | Q3 | Q4 | all computes |", "|---|---|---|---|---|---|"]
            for mode, d in diagnostics.items():
                q = " | ".join(f"{e:+.1%}" for e in d["quartiles"])
                lines.append(f"| {mode} | {q} | {d['total']:+.1%} |")
        lines.append("")
    fitted = [abs(p["fitted_other_repeat_error"]) for rows in preds.values() for p in rows
              if "fitted_other_repeat_error" in p]
    per_mode = {}
    for rows in preds.values():
        for p in rows:
            if "fitted_other_repeat_error" in p:
                per_mode.setdefault(p["mode"], []).append(p["fitted_other_repeat_error"])
    worst_mode = max((abs(statistics.median(v)) for v in per_mode.values()), default=float("nan"))
    lines += [
        "## Replay vs simulator prediction",
        "",
        "Each prediction simulates the run's own schedule with costs from a **different run**: "
        "`sim.FittedCostModel` (`f(c, L) = a c (c + L) + b (c + L) + d` per stage) fitted on the same mode's "
        "next repeat; the exact per-action costs of that repeat (`sim.TableCostModel`), which isolates the "
        "run-to-run variation of measured costs; and a per-layer fit of every mode at the other length.",
        "",
        (f"Fitted model, other repeat: largest per-mode median error {worst_mode:.1%}; largest single-run "
         f"error {max(fitted):.1%}"
         + (" (within 10%)." if max(fitted) <= 0.10 else
            (" (per-mode medians within 10%, not every run)." if worst_mode <= 0.10 else " (**outside 10%**)."))
         if fitted else "Fitted model, other repeat: not computed (one repeat per mode: no other run of the "
         "same mode to fit on; see the other-length column)."),
        "",
        *([] if tag else [
            "With one request per run vpp-pack has no next request to pack into the drain window; the same "
            "comparison with three queued requests: [runtime-results-packing.md](runtime-results-packing.md) "
            "(`--lengths 16k --requests 3 --repeat 1 --tag packing --out docs/runtime-results-packing.md`).",
            ""]),
        f"Figures: `docs/figures/runtime_<len>k{suffix}.png` (Gantt: measured and replayed timeline of each mode, "
        f"last repeat) and `docs/figures/runtime_<len>k{suffix}.trace.json` (open in ui.perfetto.dev).",
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
        {str(length): {"results": r.to_json()["results"], "predictions": preds[length],
                       "schedules": [{"mode": run.mode, "repeat": run.repeat, "schedule": run.replay.schedule.to_json()}
                                     for run in r.runs]}
         for length, r in reports.items()}, indent=1))
    print(Path(args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
