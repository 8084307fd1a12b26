"""What-if: how much of VPP's result rests on the assumed host time of a rank's second forward.

The hardware presets charge host time with the device idle on every forward: a scheduler
iteration (``chunk_overhead_s``) before a rank's first forward of a micro-batch, and
``revisit_overhead_s`` before a fold-back rank's second forward of it, which reuses the batch's
set-up (the SGLang mode keeps its ForwardBatch). Both are assumed, not fitted
(docs/calibration.md). This script re-runs the cells with the revisit priced at a share of a
whole iteration (``--revisit-share 1.0``, the default: the second forward costs as much host time
as the first, the pessimistic end of its range). cpp and dcpp never revisit a rank, so they are
the same under both. It is a what-if on one assumed parameter, not a calibration.

Per cell (model x P x workload), as ``auto_sweep.py``: cpp and dcpp at every swept size (their
best per metric), vpp-stream with ``auto`` on the preset, and vpp-stream with ``auto`` on the
preset with the revisit re-priced. Deterministic simulator: one run per cell.

    python benchmarks/host_time_whatif.py --markdown docs/figures/host_time_whatif.md
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from auto_sweep import CHUNKS, VPP_MODE, _metrics, _workload, grid_cells, grid_parser, write_generated  # noqa: E402

from sglang_vpp.cli.common import FILL_DEFAULT  # noqa: E402
from sglang_vpp.sim.config import SimConfig  # noqa: E402
from sglang_vpp.sim.cost.analytic import AnalyticCostModel  # noqa: E402
from sglang_vpp.sim.preset_loader import load_hardware, load_model  # noqa: E402
from sglang_vpp.sim.sweep import simulate_matrix  # noqa: E402

WORKLOADS = ("short-4k", "short-16k", "long-64k")


def run_cell(model_name: str, hardware: str, num_ranks: int, workload_name: str, share: float,
             partial_fill: bool = FILL_DEFAULT) -> dict:
    model = load_model(model_name)
    hw = load_hardware(hardware)
    scaled = dataclasses.replace(hw, revisit_overhead_s=hw.chunk_overhead_s * share)
    work = _workload(workload_name)
    sim = SimConfig(record_timeline=False)
    base = [_metrics(r) for r in simulate_matrix(work, AnalyticCostModel(model, hw), model.num_layers, "cpp,dcpp",
                                                 list(CHUNKS), num_ranks, sim=sim,
                                                 partial_fill=partial_fill) if r.result.sim.ok]
    auto = {}
    for label, spec in (("preset", hw), ("scaled", scaled)):
        row = simulate_matrix(work, AnalyticCostModel(model, spec), model.num_layers, VPP_MODE, ["auto"],
                              num_ranks, sim=sim, partial_fill=partial_fill)[0]
        auto[label] = _metrics(row)
    return {"model": model_name, "pp": num_ranks, "workload": workload_name, "share": share,
            "iteration_s": hw.chunk_overhead_s, "revisit_s": hw.revisit_overhead_s,
            "best_ttft": min(base, key=lambda r: r["ttft_s"]),
            "best_tput": max(base, key=lambda r: r["throughput_tok_s"]), "auto": auto}


def _pct(cell: dict, label: str) -> tuple[float, float]:
    run = cell["auto"][label]
    ttft = 100.0 * (run["ttft_s"] - cell["best_ttft"]["ttft_s"]) / cell["best_ttft"]["ttft_s"]
    tput = 100.0 * (cell["best_tput"]["throughput_tok_s"] - run["throughput_tok_s"]) / cell["best_tput"]["throughput_tok_s"]
    return ttft, tput


def table(cells: list[dict]) -> str:
    share = cells[0]["share"] if cells else 1.0
    lines = [f"| model | P | workload | TTFT vs cpp/dcpp, preset | tok/s vs cpp/dcpp, preset | "
             f"TTFT, revisit {share:g} x iteration | tok/s, revisit {share:g} x iteration | "
             "scheduling_gap s, preset -> what-if |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        (t0, p0), (t1, p1) = _pct(c, "preset"), _pct(c, "scaled")
        gaps = [c["auto"][k]["idle_by_cause_s"].get("scheduling_gap", 0.0) for k in ("preset", "scaled")]
        lines.append(f"| {c['model']} | {c['pp']} | {c['workload']} | {t0:+.1f}% | {p0:+.1f}% | {t1:+.1f}% | "
                     f"{p1:+.1f}% | {gaps[0]:.3f} -> {gaps[1]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = grid_parser(__doc__.splitlines()[0], WORKLOADS)
    ap.add_argument("--revisit-share", type=float, default=1.0,
                    help="host time of a rank's second forward of a micro-batch as a share of a whole "
                         "scheduler iteration (1.0: as much as the first forward)")
    ap.add_argument("--markdown", type=Path, help="write the table and its header to this file")
    args = ap.parse_args(argv)
    if not 0.0 <= args.revisit_share <= 1.0:
        raise SystemExit(f"--revisit-share must be within [0, 1], got {args.revisit_share}")
    began = time.monotonic()
    cells = []
    for model, pp, workload in grid_cells(args, WORKLOADS):
        print(f"{model} P={pp} {workload} ...", file=sys.stderr, flush=True)
        cells.append(run_cell(model, args.hardware, pp, workload, args.revisit_share, args.partial_fill))
    text = table(cells)
    print(text)
    if args.markdown:
        write_generated(
            args.markdown, "host_time_whatif.py", f"{args.hardware}, {len(cells)} cells", time.monotonic() - began,
            "Positive % = vpp-stream with auto worse than the best of cpp and dcpp at their best swept size (each "
            "metric on its own). \"preset\": the preset's host times (a scheduler iteration "
            f"{cells[0]['iteration_s'] * 1e3:g} ms before a rank's first forward of a micro-batch, "
            f"{cells[0]['revisit_s'] * 1e3:g} ms before a fold-back rank's second); \"revisit s x iteration\": "
            "vpp-stream's second forward pays s of an iteration. cpp and dcpp never revisit a rank.", text,
            args.partial_fill)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
