"""Benchmark: the paper-scale sweep through the real planner and the simulator.

3 models x 5 lengths (64K..1M) x 4 chunk sizes x 6 modes = 360 planned and simulated runs on the
hardware preset (default ascend-910c, TP8 x PP2). Target: under 10 s on the 2-vCPU dev machine.

    python benchmarks/sim_sweep.py                       # time it, print the best-budget table
    python benchmarks/sim_sweep.py --profile             # where the time goes (cProfile, top 25)
    python benchmarks/sim_sweep.py --markdown docs/figures/sim_sweep.md --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.sweep import best_by_mode, simulate_matrix
from sglang_vpp.sim.workloads import long_workload

MODELS = ("qwen3-coder-30b-a3b", "deepseek-v3.1", "glm-5.2")
LENGTHS = tuple(n * 1024 for n in (64, 128, 256, 512, 1024))
CHUNKS = tuple(n * 1024 for n in (8, 16, 24, 32))
MODES = "cpp,dcpp,vpp,vpp-async,vpp-pack,vpp-taper"


def sweep(hardware: str, num_ranks: int):
    rows = {}
    hw = load_hardware(hardware)
    for name in MODELS:
        model = load_model(name)
        cost = AnalyticCostModel(model, hw)
        for length in LENGTHS:
            rows[(name, length)] = simulate_matrix(long_workload([length]), cost, model.num_layers, MODES, CHUNKS,
                                                   num_ranks, sim=SimConfig(record_timeline=False), seq_len=length)
    return rows


def _label(tokens: int) -> str:
    return f"{tokens // (1 << 20)}M" if tokens >= 1 << 20 else f"{tokens // 1024}K"


def markdown(rows, hardware: str, num_ranks: int, seconds: float) -> str:
    """Per model and length: each mode at its best chunk size (TTFT s, best chunk, bubble %),
    and VPP-pack's gain over CPP and DCPP."""
    modes = MODES.split(",")
    lines = [f"Sweep on `{hardware}`, PP={num_ranks}, one request at a time; each mode at its best chunk size in "
             f"{{8K, 16K, 24K, 32K}}: TTFT in seconds (best chunk, bubble ratio). "
             f"{sum(len(v) for v in rows.values())} runs in {seconds:.1f} s (median of repeats) "
             "(`python benchmarks/sim_sweep.py --markdown docs/figures/sim_sweep.md`).", "",
             "| model | length | " + " | ".join(modes) + " | vpp-pack vs cpp | vpp-pack vs dcpp |",
             "|---|---|" + "---|" * (len(modes) + 2)]
    for (name, length), matrix in rows.items():
        best = {mode: row for (_, mode), row in best_by_mode(matrix).items()}
        cells = []
        for mode in modes:
            r = best[mode].result
            cells.append(f"{r.sim.ttft_s:.1f} ({_label(r.chunk_size)}, {100 * r.sim.bubble_ratio:.0f}%)")
        pack = best["vpp-pack"].result.sim.ttft_s
        gain = lambda other: f"{100 * (best[other].result.sim.ttft_s / pack - 1):+.1f}%"  # noqa: E731
        lines.append(f"| {name} | {_label(length)} | " + " | ".join(cells) + f" | {gain('cpp')} | {gain('dcpp')} |")
    lines += ["", "Gain columns: how much longer the other mode's TTFT is than vpp-pack's (positive: vpp-pack faster)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="ascend-910c")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (min / median / max reported)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    profiler = cProfile.Profile() if args.profile else None
    times = []
    for _ in range(max(1, args.repeats)):
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        rows = sweep(args.hardware, args.pp)
        if profiler:
            profiler.disable()
        times.append(time.perf_counter() - start)
    runs = sum(len(v) for v in rows.values())
    seconds = statistics.median(times)
    sys.stdout.write(f"{runs} runs (plan + simulate each), {len(times)} repeats: min {min(times):.2f} s, "
                     f"median {seconds:.2f} s, max {max(times):.2f} s ({1000 * seconds / runs:.1f} ms per run)\n")
    text = markdown(rows, args.hardware, args.pp, seconds)
    sys.stdout.write(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps([row.to_dict() for matrix in rows.values() for row in matrix], indent=1))
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
