"""Cross-check: the simulator against the reference runtime at P = 2 and P = 4, vpp-taper included.

For each P, ``runtime.bench.run_bench`` runs every mode ``--repeat`` times (real rank processes,
gloo, CPU, tiny model; each run checked against the single-process reference). Each run's
replayed makespan (its own measured per-action costs on dedicated hardware) is then predicted by
the simulator from the measured cost table of *another* repeat of the same mode
(``runtime_compare.predictions``: ``table_other_repeat`` and ``fitted_other_repeat``).
Per mode and P: the median error and its min / max over runs. Two more columns separate the
model from the measurements: the error with the per-action median of *every other* repeat (less
donor noise), and the donor's cost level (its summed compute / this run's - 1): when the error
follows the level, the runs differ in how fast the host ran them, not in what the simulator
models.

    python benchmarks/sim_runtime_check.py [--pp 2,4] [--seq-len 8k] [--chunk 512] [--repeat 3]
        [--requests 1] [--partial-fill/--no-partial-fill] [--markdown docs/figures/sim_runtime_check.md]

``--requests N`` sends N prompts of ``--seq-len`` together; prompts shorter than the chunk share
a forward (the runtime batches by default, as the simulator does), so a run of short prompts checks
the simulator on batched forwards. They are filled as ``bench`` fills them unless told otherwise
(``--partial-fill/--no-partial-fill``); the page says which.

Slow (real processes): a few CPU-minutes at the defaults; wall time depends on the host's load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from runtime_compare import _Log, _donor, predictions  # noqa: E402

from sglang_vpp.runtime.bench import BenchConfig, run_bench  # noqa: E402
from sglang_vpp.runtime.replay import replay_cost  # noqa: E402
from sglang_vpp.schedule import parse_size  # noqa: E402
from sglang_vpp.sim import SimConfig, simulate_schedule  # noqa: E402

MODES = ("cpp", "dcpp", "vpp-pack", "vpp-taper")
PREDICTORS = ("table_other_repeat", "fitted_other_repeat")


def _compute_sum(samples) -> float:
    return sum(s.duration_s for s in samples if s.kind == "compute")


def pooled_and_level(report) -> dict[tuple[str, int], tuple[float, float]]:
    """Per run: (error with the median table of every other repeat, donor cost level)."""
    out = {}
    for run in report.runs:
        others = [s for r in report.runs if r.mode == run.mode and r.repeat != run.repeat for s in r.replay.samples]
        if not others:
            continue
        arrivals = dict(enumerate(a.arrival for a in run.replay.schedule.requests))
        sim = simulate_schedule(run.replay.schedule, replay_cost(others), SimConfig(record_timeline=False),
                                arrivals=arrivals)
        replayed = run.replay.result.makespan_s
        level = _compute_sum(_donor(report, run).replay.samples) / _compute_sum(run.replay.samples) - 1
        out[(run.mode, run.repeat)] = (sim.makespan_s / replayed - 1, level)
    return out


def bench_config(num_ranks: int, seq_len: int, chunk: int, repeat: int, modes=MODES, num_requests: int = 1,
                 partial_fill: bool | None = None) -> BenchConfig:
    """The ``bench`` run ``check`` replays (``partial_fill`` None: ``bench``'s default)."""
    return BenchConfig(num_ranks=num_ranks, seq_len=seq_len, chunk_size=chunk, modes=tuple(modes),
                       num_requests=num_requests, repeat=repeat, partial_fill=partial_fill)


def check(config: BenchConfig) -> list[dict]:
    """Per mode: replayed makespans and the predictors' errors (see the module docstring)."""
    report = run_bench(config, _Log(f"pp={config.num_ranks}"))
    rows = predictions(report, None)
    extra = pooled_and_level(report)
    out = []
    for mode in config.modes:
        mine = [r for r in rows if r["mode"] == mode]
        entry = {"pp": config.num_ranks, "mode": mode,
                 "replay_makespan_s": [r["replay_makespan_s"] for r in mine],
                 "max_abs_diff": max(run.max_abs_diff for run in report.runs if run.mode == mode)}
        for name in PREDICTORS:
            entry[name] = [r[f"{name}_error"] for r in mine if f"{name}_error" in r]
        entry["table_other_repeats_median"] = [extra[(mode, r["repeat"])][0] for r in mine if (mode, r["repeat"]) in extra]
        entry["donor_level"] = [extra[(mode, r["repeat"])][1] for r in mine if (mode, r["repeat"]) in extra]
        out.append(entry)
    return out


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))} to {fmt.format(max(values))})"


def _batching(seq_len: int, chunk: int, fills: bool) -> str:
    """How the runtime's batches (the simulator replays its plan) fill a forward with prompts of
    one length, with partial fill (``fills``) or whole requests only."""
    if chunk == seq_len:
        return "one prompt per forward"
    if chunk % seq_len == 0:
        return f"up to {chunk // seq_len} whole prompts per forward: batching on in the runtime and the simulator"
    if chunk < seq_len:
        if fills:
            return ("each prompt in chunks, the next prompt's head joining where a last chunk leaves room: partial "
                    "fill on in the runtime and the simulator")
        return "each prompt in chunks, its last chunk alone: partial fill off in the runtime and the simulator"
    if fills:
        return ("a forward takes whole prompts while they fit, then the head of the next in what is left: "
                "batching and partial fill on in the runtime and the simulator")
    return ("a forward takes whole prompts while they fit: batching on, partial fill off in the runtime and the "
            "simulator")


def markdown(entries: list[dict], seq_len: int, chunk: int, repeat: int, num_requests: int = 1, *,
             fills: bool) -> str:
    """The page; ``fills``: whether the runs' batches were filled (``BenchConfig.fills``)."""
    if num_requests == 1:
        prompts = f"one {seq_len}-token prompt"
    else:
        prompts = f"{num_requests} prompts of {seq_len} tokens sent together ({_batching(seq_len, chunk, fills)})"
    lines = [f"tiny-qwen3 (8 layers, fp32, CPU, gloo), {prompts}, {chunk}-token chunks, {repeat} "
             "repeats per mode. Error = simulated / replayed makespan - 1, median (min to max) over runs; the "
             "simulator is fed the measured costs of another repeat of the same mode.", "",
             "| P | mode | replayed makespan s | error, table of another repeat | error, fit of another repeat | "
             "error, median table of the other repeats | donor cost level | max abs diff vs reference |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        cells = [_spread([100 * x for x in e[name]], '{:+.1f} %')
                 for name in (*PREDICTORS, "table_other_repeats_median", "donor_level")]
        lines.append(f"| {e['pp']} | {e['mode']} | {_spread(e['replay_makespan_s'], '{:.2f}')} | "
                     + " | ".join(cells) + f" | {e['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", default="2,4")
    parser.add_argument("--seq-len", default="8k")
    parser.add_argument("--chunk", default="512")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--partial-fill", action=argparse.BooleanOptionalAction, default=None,
                        help="Fill the batches (default: as bench does, with the batches).")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    seq_len, chunk = parse_size(args.seq_len), parse_size(args.chunk)
    configs = [bench_config(int(p), seq_len, chunk, args.repeat, num_requests=args.requests,
                            partial_fill=args.partial_fill) for p in args.pp.split(",")]
    entries = [entry for config in configs for entry in check(config)]
    text = markdown(entries, seq_len, chunk, args.repeat, args.requests, fills=configs[0].fills)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
