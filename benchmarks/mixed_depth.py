"""Benchmark: mixed traffic at pipeline depths P = 2, 4, 8, the paper's rules against vpp-stream.

DeepSeek-V3.1 on Ascend 910C (shipped presets, analytic cost model), the mixed workload (60
requests, concurrency 16), every mode at each chunk size of 8K-32K. Writes four blocks into
docs/simulator.md, each between ``<!-- BEGIN sim_docs:NAME -->`` and its END marker:

- ``mixed-depth``, batches of whole requests only: per P, cpp, dcpp, vpp-pack (the paper's rules:
  one V per request, packing in the drain window), vpp-stream held to a 2P-1 window (the barrier
  alone removed) and vpp-stream, each at its best chunk size for TTFT and for throughput, on seed
  0; then vpp-pack and vpp-stream against the best of cpp and dcpp over seeds 0-4 as min / median
  / max (the simulator is deterministic: the spread is the workload's);
- ``mixed-depth-idle``: idle by cause (seconds per rank, mean over ranks) of each mode at its best
  TTFT chunk, seed 0, of those runs;
- ``mixed-depth-fill``: both tables again with partial fill, as SGLang's prefill adder batches
  (the simulator's default);
- ``mixed-depth-decode``: decode in steady state (``sim.decode``): 64 running requests at 16K
  context, per mode and P, in the decode slots and spread over every slot.

    python benchmarks/mixed_depth.py           # print the tables
    python benchmarks/mixed_depth.py --write   # rewrite the doc blocks
    python benchmarks/mixed_depth.py --check   # exit 1 when a doc block is out of date

About two minutes of CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from sglang_vpp.schedule import build_layout, default_in_flight_limit
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.decode import estimate_decode
from sglang_vpp.sim.idle import IDLE_CAUSES
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.sweep import simulate_matrix, size_label
from sglang_vpp.sim.workloads import mixed_workload
from sglang_vpp.sim.workloads.mixed import DEFAULT_CONCURRENCY

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "simulator.md"
DEPTHS = (2, 4, 8)
CHUNKS = [n * 1024 for n in (8, 16, 24, 32)]
MODES = ("cpp", "dcpp", "vpp-pack", "vpp-stream")
ABLATION = "vpp-stream, 2P-1 window"
RIVALS = ("cpp", "dcpp")
DECODE_MODES = ("cpp", "vpp-async", "vpp-pack", "vpp-stream")
DECODE_RUNNING, DECODE_CONTEXT = 64, 16384
SEEDS = (0, 1, 2, 3, 4)
REQUESTS, CONCURRENCY = 60, DEFAULT_CONCURRENCY


def _sim_docs():
    """``replace_block`` of the doc generator next to this script (one marker format)."""
    spec = importlib.util.spec_from_file_location("sim_docs", Path(__file__).with_name("sim_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_runs(model, cost, num_ranks: int, seed: int, *, partial_fill: bool,
              ablation: bool = False) -> dict[str, dict[str, object]]:
    """Mode -> {"ttft": result at its best TTFT chunk, "throughput": at its best throughput chunk}.
    ``ablation``: also ``ABLATION``, vpp-stream held to vpp-pack's 2P-1 window (no barrier, no
    other change: with 2P-1 in flight stage 0 cannot start, so the order rule never applies).
    ``partial_fill``: batches start the request that overflows them (False: whole requests)."""
    work = mixed_workload(REQUESTS, seed, CONCURRENCY)
    quiet = SimConfig(record_timeline=False)
    results = [r.result for r in simulate_matrix(work, cost, model.num_layers, ",".join(MODES), CHUNKS, num_ranks,
                                                 sim=quiet, partial_fill=partial_fill)]
    labelled = [(r.mode, r) for r in results]
    if ablation:
        window = default_in_flight_limit(build_layout(num_ranks, model.num_layers, "foldback"))  # vpp-pack's 2P-1
        labelled += [(ABLATION, run_mode("vpp-stream", work, cost, RunConfig(num_ranks, chunk, max_in_flight=window,
                                                                           sim=quiet, partial_fill=partial_fill),
                                                        model.num_layers))
                     for chunk in CHUNKS]
    best: dict[str, dict[str, object]] = {}
    for label in dict.fromkeys(label for label, _ in labelled):
        mine = [r for name, r in labelled if name == label and r.sim.ok]
        best[label] = {"ttft": min(mine, key=lambda r: r.sim.ttft_s),
                       "throughput": max(mine, key=lambda r: r.sim.throughput_tok_s)}
    return best


def _versus_rivals(best: dict, mode: str) -> tuple[float, float]:
    """``mode``'s TTFT and throughput change against the best rival, in %."""
    ttft = min(best[m]["ttft"].sim.ttft_s for m in RIVALS)
    throughput = max(best[m]["throughput"].sim.throughput_tok_s for m in RIVALS)
    return (100 * (best[mode]["ttft"].sim.ttft_s / ttft - 1),
            100 * (best[mode]["throughput"].sim.throughput_tok_s / throughput - 1))


def _spread(values: list[float]) -> str:
    return f"{min(values):+.1f} / {statistics.median(values):+.1f} / {max(values):+.1f} %"


def compute_blocks() -> dict[str, str]:
    model = load_model("deepseek-v3.1")
    cost = AnalyticCostModel(model, load_hardware("ascend-910c"))
    runs = {(p, seed): best_runs(model, cost, p, seed, partial_fill=False, ablation=seed == SEEDS[0])
            for p in DEPTHS for seed in SEEDS}
    filled = {(p, seed): best_runs(model, cost, p, seed, partial_fill=True, ablation=seed == SEEDS[0])
              for p in DEPTHS for seed in SEEDS}
    shown = MODES[:3] + (ABLATION,) + MODES[3:]
    idle = _idle_table({p: runs[(p, SEEDS[0])] for p in DEPTHS}, shown)
    return {"mixed-depth": _best_table(runs, shown), "mixed-depth-idle": idle,
            "mixed-depth-fill": _best_table(filled, shown) + "\n\n" + _idle_table(
                {p: filled[(p, SEEDS[0])] for p in DEPTHS}, shown),
            "mixed-depth-decode": _decode_table(model, cost)}


def _best_table(runs: dict, shown: tuple[str, ...]) -> str:
    """Each mode at its best chunk per P (seed 0), and the fold-back modes against the best of cpp
    and dcpp over every seed."""
    lines = ["| P | mode | TTFT s (chunk) | tok/s (chunk) | TTFT vs best of cpp/dcpp | tok/s vs best of cpp/dcpp |",
             "|---|---|---|---|---|---|"]
    for p in DEPTHS:
        best = runs[(p, 0)]
        for mode in shown:
            ttft, thr = best[mode]["ttft"], best[mode]["throughput"]
            cells = ("", "") if mode in RIVALS else tuple(f"{v:+.1f} %" for v in _versus_rivals(best, mode))
            lines.append(f"| {p} | {mode} | {ttft.sim.ttft_s:.1f} ({size_label(ttft.chunk_size)}) | "
                         f"{thr.sim.throughput_tok_s:.0f} ({size_label(thr.chunk_size)}) | {cells[0]} | {cells[1]} |")
    lines += ["", f"Over seeds {SEEDS[0]}-{SEEDS[-1]} of the workload, against the best of cpp and dcpp "
              "(min / median / max):", "", "| P | vpp-pack TTFT | vpp-pack tok/s | vpp-stream TTFT | vpp-stream tok/s |",
              "|---|---|---|---|---|"]
    for p in DEPTHS:
        cells = []
        for mode in ("vpp-pack", "vpp-stream"):
            changes = [_versus_rivals(runs[(p, seed)], mode) for seed in SEEDS]
            cells += [_spread([c[0] for c in changes]), _spread([c[1] for c in changes])]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _decode_table(model, cost) -> str:
    """``sim.decode.estimate_decode``: ITL of ``DECODE_RUNNING`` requests at ``DECODE_CONTEXT``,
    in the controller's decode slots and, for comparison, spread over every slot of the mode."""
    lines = ["| P | mode | decode micro-batches | requests per micro-batch | forwards per rank per round | ITL ms "
             "| vs cpp | all slots: micro-batches | all slots: ITL ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in DEPTHS:
        estimates = [estimate_decode(mode, p, model.num_layers, cost, DECODE_RUNNING, DECODE_CONTEXT)
                     for mode in DECODE_MODES]
        spread = [estimate_decode(mode, p, model.num_layers, cost, DECODE_RUNNING, DECODE_CONTEXT, all_slots=True)
                  for mode in DECODE_MODES]
        for e, a in zip(estimates, spread):
            lines.append(f"| {p} | {e.mode} | {e.slots} | {e.requests_per_micro_batch} | {e.forwards_per_round} | "
                         f"{1000 * e.itl_s:.0f} | {e.itl_s / estimates[0].itl_s:.2f}x | {a.slots} | "
                         f"{1000 * a.itl_s:.0f} |")
    return "\n".join(lines)


def _idle_table(best_by_depth: dict[int, dict], modes: tuple[str, ...]) -> str:
    results = [(p, mode, best[mode]["ttft"]) for p, best in best_by_depth.items() for mode in modes]
    causes = [c for c in IDLE_CAUSES if any(abs(r.sim.idle_by_cause[c]) > 0.005 for _, _, r in results)]
    lines = ["| P | mode | chunk | makespan s | bubble % | " + " | ".join(causes) + " |",
             "|---|---|---|---|---|" + "---|" * len(causes)]
    for p, mode, result in results:
        s = result.sim
        lines.append(f"| {p} | {mode} | {size_label(result.chunk_size)} | {s.makespan_s:.1f} | "
                     f"{100 * s.bubble_ratio:.1f} | " + " | ".join(f"{s.idle_by_cause[c]:.1f}" for c in causes) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the doc blocks")
    action.add_argument("--check", action="store_true", help="exit 1 when a doc block is stale")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    blocks = compute_blocks()
    seconds = time.perf_counter() - start
    replace_block = _sim_docs().replace_block
    text = DOC.read_text()
    updated = text
    for name, body in blocks.items():
        updated = replace_block(updated, name, body)
        if not args.write and not args.check:
            sys.stdout.write(f"## {name}\n\n{body}\n\n")
    stale = updated != text
    sys.stdout.write(f"{len(blocks)} blocks computed in {seconds:.1f} s; docs/simulator.md "
                     f"{'stale' if stale else 'up to date'}\n")
    if args.write and stale:
        DOC.write_text(updated)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
