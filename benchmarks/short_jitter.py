"""What-if: the short cells of ``auto_sweep.py`` with stage times that vary around the estimate.

The simulator runs every stage exactly as the cost model estimates it, so in a short cell (100
equal prompts) every micro-batch costs the same and the V's returning micro-batch reaches a
rank just after the rank has started its next forward: the hop per rank that puts auto's TTFT
behind cpp's there (docs/auto-chunk.md, "TTFT pays a hop per rank"). A real device does not
repeat a stage's time exactly. This script runs the same cells with ``--jitter`` (each stage's
time times ``1 + spread * z``, z standard normal, seeded; ``sim/cost/jitter.py``): the
controller still decides with the unjittered estimate, as a server decides with its own. The
spread is assumed, not measured on any hardware: the table shows several. So is what one draw
covers (``stage`` or ``rank``, ``RunConfig.jitter_by``; what each means for a fold-back rank:
``sim/cost/jitter.py``); the table shows both.

Per cell (model x P x short workload), spread, draw and seed: cpp and dcpp at every swept size and
vpp-stream with ``auto``. The baseline is the cpp/dcpp run (mode and size) with the best median
over the seeds, for each metric on its own, as the exact table takes the best swept size.
auto against it, seed by seed (the same seed draws the same factor for the same stage, request
and chunk), is a paired comparison with ``sglang_vpp.verdict.compare``: a difference counts when
its median is at least 1 % and the seeds agree in sign (one in five may not); otherwise "no
significant difference". Spread 0 is the exact table's run (one run, no range): the main
table of docs/auto-chunk.md, or with ``--no-partial-fill`` (whole requests only, as the
published figure and the page's idle analysis) its whole-request block.

``--idle`` adds, per row, auto and the two baselines (mean over the seeds): TTFT, the first
TTFT (the earliest completion's, whichever request it is), the makespan and the bubble per rank
by cause (``sim/idle.py``). A micro-batch
that waits while its rank computes another one is no rank's idle: a TTFT that rises while the
makespan and the bubble stay shows there as a later first TTFT.

    python benchmarks/short_jitter.py --no-partial-fill --markdown docs/figures/short_jitter.md
    python benchmarks/short_jitter.py --models deepseek-v3.1 --pp 8 --workloads short-16k --seeds 3 --jitter-by rank
    python benchmarks/short_jitter.py --models deepseek-v3.1 --pp 8 --workloads short-4k,short-16k --jitter 0,0.05 \
        --no-partial-fill --idle
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from auto_sweep import CHUNKS, VPP_MODE, _metrics, _size, _workload, grid_cells, grid_parser, write_generated  # noqa: E402

from sglang_vpp.cli.common import FILL_DEFAULT  # noqa: E402
from sglang_vpp.sim.config import SimConfig  # noqa: E402
from sglang_vpp.sim.cost.analytic import AnalyticCostModel  # noqa: E402
from sglang_vpp.sim.cost.jitter import check_jitter  # noqa: E402
from sglang_vpp.sim.idle import IDLE_CAUSES  # noqa: E402
from sglang_vpp.sim.model_spec import ModelSpec  # noqa: E402
from sglang_vpp.sim.preset_loader import load_hardware, load_model  # noqa: E402
from sglang_vpp.sim.runner import JITTER_BY  # noqa: E402
from sglang_vpp.sim.sweep import simulate_matrix  # noqa: E402
from sglang_vpp.sim.workloads.base import Workload  # noqa: E402
from sglang_vpp.verdict import MIN_EFFECT, compare  # noqa: E402

WORKLOADS = ("short-4k", "short-16k")
SPREADS = (0.0, 0.02, 0.05, 0.10)
SEEDS = 5
DRAWS = JITTER_BY
BASE_MODES = "cpp,dcpp"


def _measures(row) -> dict:
    """``_metrics`` plus what the idle table reads besides the bubble: the makespan and the first
    TTFT (the earliest completion's)."""
    s = row.result.sim
    return {**_metrics(row), "makespan_s": s.makespan_s, "first_ttft_s": min(s.request_ttft_s.values())}


class Cell(NamedTuple):
    """What every seed of a cell shares."""

    label: str
    model: ModelSpec
    cost: AnalyticCostModel
    work: Workload


def _runs(cell: Cell, num_ranks: int, spread: float, draw: str, seed: int,
          partial_fill: bool) -> tuple[dict, list[dict]]:
    """(vpp-stream auto, every cpp/dcpp run) of one cell at one spread, draw and seed."""
    model, cost, work = cell.model, cell.cost, cell.work
    sim = SimConfig(record_timeline=False)
    base = simulate_matrix(work, cost, model.num_layers, BASE_MODES, list(CHUNKS), num_ranks, sim=sim,
                           jitter=spread, jitter_seed=seed, jitter_by=draw, partial_fill=partial_fill)
    auto = simulate_matrix(work, cost, model.num_layers, VPP_MODE, ["auto"], num_ranks, sim=sim,
                           jitter=spread, jitter_seed=seed, jitter_by=draw, partial_fill=partial_fill)[0]
    if not auto.result.sim.ok or not all(row.result.sim.ok for row in base):
        raise SystemExit(f"{cell.label} P={num_ranks} jitter {spread} per {draw} seed {seed}: a run deadlocked")
    return _measures(auto), [_measures(row) for row in base]


def _cell(model_name: str, hardware: str, workload_name: str) -> Cell:
    model = load_model(model_name)
    return Cell(f"{model_name} {workload_name}", model, AnalyticCostModel(model, load_hardware(hardware)),
                _workload(workload_name))


def _best(per_seed: list[list[dict]], metric: str, lower_is_better: bool) -> tuple[str, list[dict]]:
    """The label (mode and size) of the cpp/dcpp run with the best median of ``metric`` over the
    seeds, and that run in each seed (every seed runs the same modes and sizes in one order)."""
    by_label = {f"{run['mode']} {_size(run)}": [runs[i] for runs in per_seed] for i, run in enumerate(per_seed[0])}
    pick = (min if lower_is_better else max)(by_label, key=lambda label: statistics.median(
        run[metric] for run in by_label[label]))
    return pick, by_label[pick]


def run_cell(model_name: str, hardware: str, num_ranks: int, workload_name: str, spread: float,
             seeds: int, draw: str = DRAWS[0], partial_fill: bool = FILL_DEFAULT) -> dict:
    cell = _cell(model_name, hardware, workload_name)
    per_seed = [_runs(cell, num_ranks, spread, draw, seed, partial_fill) for seed in range(seeds if spread else 1)]
    auto = [a for a, _ in per_seed]
    base = [b for _, b in per_seed]
    ttft_label, ttft_base = _best(base, "ttft_s", lower_is_better=True)
    tput_label, tput_base = _best(base, "throughput_tok_s", lower_is_better=False)
    # Time per token, so that both metrics are "lower is better" for the paired rule.
    ttft = compare({"auto": [a["ttft_s"] for a in auto], "base": [b["ttft_s"] for b in ttft_base]},
                   "auto", "base", paired=True)
    per_token = compare({"auto": [1.0 / a["throughput_tok_s"] for a in auto],
                         "base": [1.0 / b["throughput_tok_s"] for b in tput_base]}, "auto", "base", paired=True)
    auto_sizes = sorted({_size(a) for a in auto})
    return {"model": model_name, "pp": num_ranks, "workload": workload_name, "spread": spread,
            "draw": draw if spread else "-", "seeds": len(per_seed), "auto_sizes": auto_sizes,
            "ttft_base": ttft_label, "tput_base": tput_label, "ttft": ttft, "per_token": per_token,
            # Per seed, for the idle table: auto, then the TTFT baseline and the throughput one.
            "runs": {f"{VPP_MODE} auto {'/'.join(auto_sizes)}": auto, ttft_label: ttft_base, tput_label: tput_base}}


def _shown(comparison) -> str:
    """Median [min .. max] (with the decimals that keep the median on its side of the floor) and
    the outcome; one run: the value alone."""
    median, bounds = comparison.range_text()
    return median if comparison.repeats < 2 else f"{median} {bounds} {comparison.outcome}"


def table(cells: list[dict]) -> str:
    lines = ["| model | P | workload | jitter | drawn per | auto size | TTFT vs cpp/dcpp (best median) | "
             "time per token vs cpp/dcpp (best median) |", "|" + "---|" * 8]
    for c in cells:
        lines.append(f"| {c['model']} | {c['pp']} | {c['workload']} | {c['spread']:.0%} | {c['draw']} | "
                     f"{'/'.join(c['auto_sizes'])} | {_shown(c['ttft'])} ({c['ttft_base']}) | "
                     f"{_shown(c['per_token'])} ({c['tput_base']}) |")
    return "\n".join(lines)


def idle_table(cells: list[dict]) -> str:
    """Per row and run (auto, the TTFT baseline, the throughput one): TTFT, first TTFT, makespan
    and the bubble per rank by cause (s, mean over ranks), each the mean over the seeds."""
    def mean(runs: list[dict], key: str) -> float:
        return statistics.fmean(run[key] for run in runs)

    def cause(runs: list[dict], name: str) -> float:
        return statistics.fmean(run["idle_by_cause_s"][name] for run in runs)

    shown = [c for c in IDLE_CAUSES
             if any(abs(cause(runs, c)) > 1e-9 for cell in cells for runs in cell["runs"].values())]
    lines = ["| model | P | workload | jitter | drawn per | run | TTFT s | first TTFT s | makespan s | bubble s | "
             + " | ".join(shown) + " |", "|" + "---|" * (10 + len(shown))]
    for c in cells:
        for label, runs in c["runs"].items():
            causes = " | ".join(f"{cause(runs, k):.3f}" for k in shown)
            lines.append(f"| {c['model']} | {c['pp']} | {c['workload']} | {c['spread']:.0%} | {c['draw']} | {label} | "
                         f"{mean(runs, 'ttft_s'):.3f} | {mean(runs, 'first_ttft_s'):.3f} | "
                         f"{mean(runs, 'makespan_s'):.3f} | {mean(runs, 'bubble_s'):.3f} | {causes} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = grid_parser(__doc__.splitlines()[0], WORKLOADS)
    ap.add_argument("--jitter", default=",".join(f"{s:g}" for s in SPREADS),
                    help="relative spreads of a stage's time, comma-separated (0: the exact run)")
    ap.add_argument("--jitter-by", default=",".join(DRAWS),
                    help="what one draw covers, comma-separated: stage (each stage of a chunk) or rank (a "
                         "chunk's stages on one rank)")
    ap.add_argument("--seeds", type=int, default=SEEDS, help="seeds per spread above 0 (at least 2 for a range)")
    ap.add_argument("--markdown", type=Path, help="write the table and its header to this file")
    ap.add_argument("--idle", action="store_true",
                    help="also print auto's and the baselines' TTFT, first TTFT, makespan and bubble by cause "
                         "(mean over the seeds)")
    args = ap.parse_args(argv)
    if args.seeds < 2:
        raise SystemExit(f"--seeds must be at least 2 (one seed gives no range), got {args.seeds}")
    try:
        spreads = [float(s) for s in args.jitter.split(",")]
    except ValueError:
        raise SystemExit(f"--jitter takes comma-separated numbers, got {args.jitter!r}") from None
    for spread in spreads:
        try:
            check_jitter(spread)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    draws = args.jitter_by.split(",")
    if not all(draw in DRAWS for draw in draws):
        raise SystemExit(f"--jitter-by takes {' or '.join(DRAWS)}, comma-separated; got {args.jitter_by!r}")
    grid = grid_cells(args, WORKLOADS)
    began = time.monotonic()
    cells = []
    for model, pp, workload in grid:
        for spread in spreads:
            for draw in draws if spread else draws[:1]:
                print(f"{model} P={pp} {workload} jitter {spread:g} per {draw} ...", file=sys.stderr, flush=True)
                cells.append(run_cell(model, args.hardware, pp, workload, spread, args.seeds, draw, args.partial_fill))
    text = table(cells)
    print(text)
    if args.idle:
        print(f"\nTTFT, first TTFT, makespan and bubble per rank by cause (s, mean over ranks), mean over the "
              f"seeds:\n\n{idle_table(cells)}")
    if args.markdown:
        write_generated(
            args.markdown, "short_jitter.py", f"{args.hardware}, {len(cells)} rows, {args.seeds} seeds per spread above 0",
            time.monotonic() - began,
            "Positive % = vpp-stream with auto worse than the cpp/dcpp run (mode and swept size) with the best "
            "median over the seeds, each metric on its own: TTFT, and time per token (the inverse of throughput). "
            "Median [min .. max] of the per-seed difference and the paired verdict (a difference counts when its "
            f"median is at least {MIN_EFFECT:.0%} and the seeds agree in sign, one in five may not). \"drawn per\": "
            "stage, each stage of a chunk draws its own time; rank, a chunk's stages on one rank share one draw. "
            "The spread and what a draw covers are assumed, not measured.", text, args.partial_fill)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
