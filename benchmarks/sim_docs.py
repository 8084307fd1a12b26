"""Benchmark: regenerate every simulator number in docs/calibration.md and docs/simulator.md.

Each table lives between ``<!-- BEGIN sim_docs:NAME -->`` and ``<!-- END sim_docs:NAME -->`` in
its doc; this script recomputes it from the shipped presets and the real planner and rewrites
the block (``--write``), or reports which blocks are stale (``--check``, exit 1). Target: under
a minute on the 2-vCPU dev machine.

    python benchmarks/sim_docs.py --write      # recompute and rewrite the doc blocks
    python benchmarks/sim_docs.py --check      # exit 1 when a doc block is out of date
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from sglang_vpp.schedule import ChunkSpec, Policy, StageSpec
from sglang_vpp.sim.calibration import (ASSUMED_FIELDS, FITTED_FIELDS, METHOD_DOC_TABLE, ROWS, at_bounds, errors, evaluate,
                                        sensitivity, trend)
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.idle import IDLE_CAUSES
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.priors import PRIORS
from sglang_vpp.sim.sweep import simulate_matrix, size_label
from sglang_vpp.sim.workloads import long_workload, mixed_workload, short_workload

ROOT = Path(__file__).resolve().parent.parent
DOCS = {"calibration": ROOT / "docs" / "calibration.md", "simulator": ROOT / "docs" / "simulator.md"}
DEEP_CHUNKS = [n * 1024 for n in (8, 16, 24, 32, 64)]
DEEP_MODES = "cpp,dcpp,vpp-pack,vpp-taper"
ALL_MODES = ",".join(Policy)
ROW_NAMES = {"compute_s": "compute", "bubble_s": "bubble", "exposed_comm_s": "exposed communication",
             "total_s": "total (TTFT)"}


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 0.01:
        return f"{value:.3g}"
    return f"{value:.2e}"


def calibration_rows(model, hardware) -> str:
    rows = evaluate(model, hardware)
    errs = errors(rows)
    target = METHOD_DOC_TABLE.rows
    lines = ["| row | CPP measured | CPP simulated | error | DCPP measured | DCPP simulated | error |",
             "|---|---|---|---|---|---|---|"]
    for row in ROWS:
        cells = []
        for mode in ("cpp", "dcpp"):
            flag = "" if abs(errs[(mode, row)]) <= 0.05 else " (miss)"
            cells += [f"{target[mode][row]:.2f}", f"{rows[mode][row]:.2f}", f"{100 * errs[(mode, row)]:+.1f} %{flag}"]
        lines.append(f"| {ROW_NAMES[row]} | " + " | ".join(cells) + " |")
    lines += ["", f"Scheduling steps on rank 0: CPP {rows['cpp']['steps']}, DCPP {rows['dcpp']['steps']} "
              f"({rows['dcpp']['steps'] / rows['cpp']['steps']:.1f}x; the doc: 4.4x)."]
    return "\n".join(lines)


def calibration_trend(model, hardware) -> str:
    deltas = trend(model, hardware, METHOD_DOC_TABLE.trend_lengths, METHOD_DOC_TABLE.trend_chunk_sizes)
    lines = ["| length | measured | simulated |", "|---|---|---|"]
    for (length, delta), (low, high) in zip(deltas.items(), METHOD_DOC_TABLE.trend_ranges):
        lines.append(f"| {size_label(length)} | {100 * low:+.1f} to {100 * high:+.1f} % | {100 * delta:+.1f} % |")
    return "\n".join(lines)


def calibration_fields(hardware) -> str:
    bounds = at_bounds(hardware)
    lines = ["| field | value | fitted | range | on a bound | source of the range |", "|---|---|---|---|---|---|"]
    for name in FITTED_FIELDS + ASSUMED_FIELDS:
        prior = PRIORS[name]
        side = bounds.get(name, "")
        source = ("assumed: " if prior.assumed else "") + prior.source
        lines.append(f"| `{name}` | {_fmt(getattr(hardware, name))} | {'yes' if name in FITTED_FIELDS else 'no, set'} | "
                     f"{_fmt(prior.low)} - {_fmt(prior.high)} | {side or 'no'} | {source} |")
    return "\n".join(lines)


def calibration_sensitivity(model, hardware) -> str:
    base = evaluate(model, hardware)
    table = sensitivity(model, hardware, fields=FITTED_FIELDS + ASSUMED_FIELDS)
    lines = ["Change of each simulated row (seconds per rank) when one field moves to the low / high end of its "
             "range, the others as fitted.", "",
             "| field | CPP compute | CPP bubble | CPP exp. comm | CPP total | DCPP compute | DCPP bubble | "
             "DCPP exp. comm | DCPP total |", "|---|---|---|---|---|---|---|---|---|"]
    for name in FITTED_FIELDS + ASSUMED_FIELDS:
        cells = []
        for mode in ("cpp", "dcpp"):
            for row in ROWS:
                low = table[name]["low"][mode][row] - base[mode][row]
                high = table[name]["high"][mode][row] - base[mode][row]
                cells.append(f"{low:+.1f} / {high:+.1f}")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def idle_at_calibration_point(model, cost) -> str:
    rows = simulate_matrix(long_workload([METHOD_DOC_TABLE.seq_len]), cost, model.num_layers, ALL_MODES,
                           [METHOD_DOC_TABLE.chunk_size], METHOD_DOC_TABLE.num_ranks,
                           sim=SimConfig(record_timeline=False))
    causes = [c for c in IDLE_CAUSES if any(abs(r.result.sim.idle_by_cause[c]) > 1e-9 for r in rows)]
    lines = ["| mode | TTFT s | bubble s | " + " | ".join(causes) + " |", "|---|---|---|" + "---|" * len(causes)]
    for row in rows:
        s = row.result.sim
        lines.append(f"| {row.result.mode} | {s.ttft_s:.1f} | {s.bubble_s:.2f} | "
                     + " | ".join(f"{s.idle_by_cause[c]:.2f}" for c in causes) + " |")
    return "\n".join(lines)


JITTER = 0.03
JITTER_SEEDS = range(10)
JITTER_MODES = "cpp,dcpp,vpp"
JITTER_CAUSES = ("upstream_wait", "rendezvous", "admission", "drain")


def jitter_at_512k(model, cost) -> str:
    """TTFT and idle by cause at 512K with no jitter and with 3 % jitter over ten seeds."""
    point = METHOD_DOC_TABLE
    lines = ["| P | mode | TTFT s, no jitter | TTFT s, 3 % jitter (min / median / max) | "
             "bubble s, no jitter -> median | " + " | ".join(f"{c} s" for c in JITTER_CAUSES) + " |",
             "|---|---|---|---|---|" + "---|" * len(JITTER_CAUSES)]
    for num_ranks in (2, 4):
        def run(jitter: float, seed: int):
            return {r.result.mode: r.result.sim for r in simulate_matrix(
                long_workload([point.seq_len]), cost, model.num_layers, JITTER_MODES, [point.chunk_size], num_ranks,
                sim=SimConfig(record_timeline=False), jitter=jitter, jitter_seed=seed)}
        exact = run(0.0, 0)
        jittered = [run(JITTER, seed) for seed in JITTER_SEEDS]
        for mode in JITTER_MODES.split(","):
            ttfts = sorted(r[mode].ttft_s for r in jittered)
            median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731 (upper median of ten)
            causes = " | ".join(f"{exact[mode].idle_by_cause.get(c, 0.0):.2f} -> "
                                f"{median([r[mode].idle_by_cause.get(c, 0.0) for r in jittered]):.2f}"
                                for c in JITTER_CAUSES)
            lines.append(f"| {num_ranks} | {mode} | {exact[mode].ttft_s:.1f} | {ttfts[0]:.1f} / {median(ttfts):.1f} / "
                         f"{ttfts[-1]:.1f} | {exact[mode].bubble_s:.2f} -> {median([r[mode].bubble_s for r in jittered]):.2f}"
                         f" | {causes} |")
    return "\n".join(lines)


def deep_pipeline(model, cost) -> str:
    lines = ["| P | chunk | cpp | dcpp | vpp-pack | vpp-taper | vpp-taper chunks | vpp-taper vs best of cpp/dcpp |",
             "|---|---|---|---|---|---|---|---|"]
    notes = []
    for num_ranks in (2, 4, 8):
        rows = simulate_matrix(long_workload([512 * 1024]), cost, model.num_layers, DEEP_MODES, DEEP_CHUNKS,
                               num_ranks, sim=SimConfig(record_timeline=False))
        by = {(r.result.mode, r.result.chunk_size): r.result for r in rows}
        for chunk in DEEP_CHUNKS:
            ttft = {mode: by[(mode, chunk)].sim.ttft_s for mode in DEEP_MODES.split(",")}
            rival = min(ttft["cpp"], ttft["dcpp"])
            lines.append(f"| {num_ranks} | {size_label(chunk)} | " + " | ".join(f"{v:.1f}" for v in ttft.values())
                         + f" | {by[('vpp-taper', chunk)].sim.num_chunks} | {100 * (ttft['vpp-taper'] / rival - 1):+.1f} % |")
        bound = min(r.result.lower_bound_s for r in rows)
        best = min((by[("vpp-taper", c)] for c in DEEP_CHUNKS), key=lambda r: r.sim.makespan_s)
        pack = min((by[("vpp-pack", c)] for c in DEEP_CHUNKS), key=lambda r: r.sim.makespan_s)
        notes.append(f"P = {num_ranks}: lower bound {bound:.1f} s; vpp-taper best {best.sim.makespan_s:.1f} s "
                     f"({100 * (best.sim.makespan_s / bound - 1):+.1f} %), vpp-pack best {pack.sim.makespan_s:.1f} s "
                     f"at {size_label(pack.chunk_size)} ({100 * (pack.sim.makespan_s / bound - 1):+.1f} %).")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def short_prompt_chunks(model, cost) -> str:
    """A 64K prompt at chunk sizes 2K-32K: per-forward costs make very small chunks lose."""
    sizes = [n * 1024 for n in (2, 4, 8, 16, 32)]
    rows = simulate_matrix(long_workload([64 * 1024]), cost, model.num_layers, "cpp,vpp-pack", sizes, 2,
                           sim=SimConfig(record_timeline=False))
    by = {(r.result.mode, r.result.chunk_size): r.result.sim for r in rows}
    lines = ["| chunk | " + " | ".join(size_label(s) for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for mode in ("cpp", "vpp-pack"):
        lines.append(f"| {mode} TTFT s | " + " | ".join(f"{by[(mode, s)].ttft_s:.2f}" for s in sizes) + " |")
    return "\n".join(lines)


def batching(model, cost) -> str:
    """Short workloads (8K chunks) and the mixed workload (24K chunks) at P = 2: one request per
    forward, SGLang's batching of whole requests up to the chunk size, and that batching with
    partial fill (the default)."""
    modes = ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-taper")
    workloads = [(short_workload(1024), 8192), (short_workload(4096), 8192), (mixed_workload(), 24576)]
    ways = {"apart": (False, False), "whole": (True, False), "filled": (True, True)}
    lines = ["| workload | chunk | mode | forwards apart / whole / filled | makespan s apart / whole / filled "
             "| mean TTFT s apart / whole / filled |", "|---|---|---|---|---|---|"]
    for workload, chunk in workloads:
        runs = {way: {r.result.mode: r.result.sim for r in simulate_matrix(
            workload, cost, model.num_layers, ",".join(modes), [chunk], 2, sim=SimConfig(record_timeline=False),
            batch_requests=batch, partial_fill=fill)} for way, (batch, fill) in ways.items()}
        for mode in modes:
            apart, whole, filled = (runs[way][mode] for way in ways)
            makespans = " / ".join(f"{r.makespan_s:.1f}" + ("" if r is apart else
                                                             f" ({100 * (r.makespan_s / apart.makespan_s - 1):+.1f} %)")
                                   for r in (apart, whole, filled))
            lines.append(f"| {workload.description} | {size_label(chunk)} | {mode} | "
                         f"{apart.num_chunks} / {whole.num_chunks} / {filled.num_chunks} | {makespans} | "
                         f"{apart.ttft_s:.2f} / {whole.ttft_s:.2f} / {filled.ttft_s:.2f} |")
    return "\n".join(lines)


def sparse_balance(cost_by_model: dict) -> str:
    """tau_k / tau_0 of one 10-layer stage (24K chunks), and vpp-pack with the even layer split
    against ``--balance auto`` at P = 4, 512K, 24K chunks."""
    chunk, ks = 24 * 1024, (0, 1, 2, 4, 8, 12, 16, 21)
    stage = StageSpec(0, 0, 10, 20)
    lines = ["| model | " + " | ".join(f"tau_{k} / tau_0" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for name, (model, cost) in cost_by_model.items():
        taus = [cost.stage_cost(stage, ChunkSpec(0, k, k * chunk, chunk)) for k in ks]
        lines.append(f"| {name} | " + " | ".join(f"{t / taus[0]:.2f}" for t in taus) + " |")
    lines += ["", "| model | vpp-pack, even split: TTFT s (bubble) | --balance auto: TTFT s (bubble) | split chosen |",
              "|---|---|---|---|"]
    for name, (model, cost) in cost_by_model.items():
        results = {}
        for balance in ("even", "auto"):
            row = simulate_matrix(long_workload([512 * 1024]), cost, model.num_layers, "vpp-pack", [chunk], 4,
                                  sim=SimConfig(record_timeline=False), balance=balance, keep_schedules=True)[0]
            results[balance] = row.result
        split = [s.num_layers for s in results["auto"].schedule.layout.stages]
        cells = [f"{r.sim.ttft_s:.2f} ({100 * r.sim.bubble_ratio:.1f} %)" for r in results.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {','.join(map(str, split))} |")
    return "\n".join(lines)


def compute_blocks() -> dict[str, tuple[str, str]]:
    """Block name -> (doc, markdown)."""
    model, hardware = load_model("deepseek-v3.1"), load_hardware("ascend-910c")
    cost = AnalyticCostModel(model, hardware)
    glm = load_model("glm-5.2")
    return {
        "calibration-rows": ("calibration", calibration_rows(model, hardware)),
        "calibration-trend": ("calibration", calibration_trend(model, hardware)),
        "calibration-fields": ("calibration", calibration_fields(hardware)),
        "calibration-sensitivity": ("calibration", calibration_sensitivity(model, hardware)),
        "jitter": ("calibration", jitter_at_512k(model, cost)),
        "idle-by-cause": ("simulator", idle_at_calibration_point(model, cost)),
        "deep-pipeline": ("simulator", deep_pipeline(model, cost)),
        "chunk-size-64k": ("simulator", short_prompt_chunks(model, cost)),
        "batching": ("simulator", batching(model, cost)),
        "sparse-balance": ("simulator", sparse_balance({"deepseek-v3.1": (model, cost),
                                                        "glm-5.2": (glm, AnalyticCostModel(glm, hardware))})),
    }


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- BEGIN sim_docs:{re.escape(name)} -->\n).*?(<!-- END sim_docs:{re.escape(name)} -->)",
                         re.S)
    if not pattern.search(text):
        raise SystemExit(f"no block sim_docs:{name} in the doc; add the BEGIN/END markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the doc blocks")
    mode.add_argument("--check", action="store_true", help="exit 1 when a doc block is stale")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    blocks = compute_blocks()
    seconds = time.perf_counter() - start
    texts = {doc: path.read_text() for doc, path in DOCS.items()}
    updated = dict(texts)
    for name, (doc, body) in blocks.items():
        updated[doc] = replace_block(updated[doc], name, body)
        if not args.write and not args.check:
            sys.stdout.write(f"## {name} ({doc}.md)\n\n{body}\n\n")
    stale = [doc for doc in DOCS if updated[doc] != texts[doc]]
    sys.stdout.write(f"{len(blocks)} blocks computed in {seconds:.1f} s; stale docs: {', '.join(stale) or 'none'}\n")
    if args.write:
        for doc in stale:
            DOCS[doc].write_text(updated[doc])
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
