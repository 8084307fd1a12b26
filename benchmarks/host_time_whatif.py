"""What-if: how much of VPP's loss on uniform short batches is the assumed host time per forward.

The hardware presets charge ``chunk_overhead_s`` (host time with the device idle) on every
forward; it is assumed, not fitted (docs/calibration.md). A fold-back rank runs two forwards
per micro-batch where a contiguous one runs one, so the simulator charges VPP twice per
micro-batch. The served CPU measurement (docs/cpu-measurements.md, "Host time per micro-batch")
found the opposite order for the two SGLang loops: the VPP loop's host time for its two forwards
was 0.46-0.65 of the stock PP loop's for one. This script asks what the short cells say under
the milder of the two readings: a VPP rank pays per micro-batch what a stock rank pays, i.e.
half the preset's host time per forward (``--vpp-host-share 0.5``). cpp and dcpp keep the
preset's. It is a what-if on one assumed parameter, not a calibration.

Per cell (model x P x workload), as ``auto_sweep.py``: cpp and dcpp at every swept size (their
best per metric), vpp-stream with ``auto`` on the preset, and vpp-stream with ``auto`` on the
preset with its host time per forward scaled. Deterministic simulator: one run per cell.

    python benchmarks/host_time_whatif.py --markdown docs/figures/host_time_whatif.md
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from auto_sweep import CHUNKS, MODELS, RANKS, VPP_MODE, _metrics, _workload  # noqa: E402

from sglang_vpp.sim.config import SimConfig  # noqa: E402
from sglang_vpp.sim.cost.analytic import AnalyticCostModel  # noqa: E402
from sglang_vpp.sim.preset_loader import load_hardware, load_model  # noqa: E402
from sglang_vpp.sim.sweep import simulate_matrix  # noqa: E402

WORKLOADS = ("short-4k", "short-16k", "long-64k")


def run_cell(model_name: str, hardware: str, num_ranks: int, workload_name: str, share: float) -> dict:
    model = load_model(model_name)
    hw = load_hardware(hardware)
    scaled = dataclasses.replace(hw, chunk_overhead_s=hw.chunk_overhead_s * share)
    work = _workload(workload_name)
    sim = SimConfig(record_timeline=False)
    base = [_metrics(r) for r in simulate_matrix(work, AnalyticCostModel(model, hw), model.num_layers, "cpp,dcpp",
                                                 list(CHUNKS), num_ranks, sim=sim) if r.result.sim.ok]
    auto = {}
    for label, spec in (("preset", hw), ("scaled", scaled)):
        row = simulate_matrix(work, AnalyticCostModel(model, spec), model.num_layers, VPP_MODE, ["auto"],
                              num_ranks, sim=sim)[0]
        auto[label] = _metrics(row)
    return {"model": model_name, "pp": num_ranks, "workload": workload_name, "share": share,
            "host_per_forward_s": hw.chunk_overhead_s,
            "best_ttft": min(base, key=lambda r: r["ttft_s"]),
            "best_tput": max(base, key=lambda r: r["throughput_tok_s"]), "auto": auto}


def _pct(cell: dict, label: str) -> tuple[float, float]:
    run = cell["auto"][label]
    ttft = 100.0 * (run["ttft_s"] - cell["best_ttft"]["ttft_s"]) / cell["best_ttft"]["ttft_s"]
    tput = 100.0 * (cell["best_tput"]["throughput_tok_s"] - run["throughput_tok_s"]) / cell["best_tput"]["throughput_tok_s"]
    return ttft, tput


def table(cells: list[dict]) -> str:
    share = cells[0]["share"] if cells else 0.5
    lines = [f"| model | P | workload | TTFT vs cpp/dcpp, preset | tok/s vs cpp/dcpp, preset | "
             f"TTFT, VPP host x {share:g} | tok/s, VPP host x {share:g} | scheduling_gap s, preset -> scaled |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        (t0, p0), (t1, p1) = _pct(c, "preset"), _pct(c, "scaled")
        gaps = [c["auto"][k]["idle_by_cause_s"].get("scheduling_gap", 0.0) for k in ("preset", "scaled")]
        lines.append(f"| {c['model']} | {c['pp']} | {c['workload']} | {t0:+.1f}% | {p0:+.1f}% | {t1:+.1f}% | "
                     f"{p1:+.1f}% | {gaps[0]:.3f} -> {gaps[1]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="ascend-910c")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--pp", default=",".join(map(str, RANKS)))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--vpp-host-share", type=float, default=0.5,
                    help="VPP's host time per forward as a share of the preset's (0.5: one stock forward's "
                         "per micro-batch)")
    ap.add_argument("--markdown", type=Path, help="write the table and its header to this file")
    args = ap.parse_args(argv)
    if not 0.0 <= args.vpp_host_share <= 1.0:
        raise SystemExit(f"--vpp-host-share must be within [0, 1], got {args.vpp_host_share}")
    began = time.monotonic()
    cells = []
    for model in args.models.split(","):
        for pp in (int(p) for p in args.pp.split(",")):
            for workload in args.workloads.split(","):
                print(f"{model} P={pp} {workload} ...", file=sys.stderr, flush=True)
                cells.append(run_cell(model, args.hardware, pp, workload, args.vpp_host_share))
    text = table(cells)
    print(text)
    if args.markdown:
        seconds = time.monotonic() - began
        args.markdown.write_text(
            f"Generated by `python benchmarks/host_time_whatif.py --markdown {args.markdown}` ({args.hardware}, "
            f"{len(cells)} cells, {seconds:.0f} s). Positive % = vpp-stream with auto worse than the best of "
            "cpp and dcpp at their best swept size (each metric on its own). \"preset\": every mode pays the "
            "preset's host time per forward; \"VPP host x s\": vpp-stream pays s of it per forward, cpp and "
            "dcpp the preset's.\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
