"""Benchmark: ``auto`` chunk size against swept chunk sizes, through the simulator.

Per cell (model x P x workload) on a hardware preset (default ascend-910c): cpp and dcpp at every
swept chunk size, the VPP mode (default vpp-stream, the fold-back mode without the request
barrier) at every swept size, and that mode with ``--chunk-size auto`` (``schedule/auto_size.py``).
The table compares auto with the best of cpp and dcpp (each metric at its own best size) and
with the VPP mode's best swept size, in mean TTFT and throughput; the idle table splits the
bubble by cause, in every short cell and every cell where auto is behind cpp/dcpp, for auto,
for vpp-pack with auto (the request barrier, short cells only) and for the best-throughput
cpp/dcpp run. The simulator is deterministic, so each
cell is one run (no spread to report).

    python benchmarks/auto_sweep.py                          # the full grid, table to stdout
    python benchmarks/auto_sweep.py --markdown docs/auto-chunk.md --json out.json
    python benchmarks/auto_sweep.py --models deepseek-v3.1 --pp 2 --workloads long-64k
    python benchmarks/auto_sweep.py --fold fused              # the VPP runs on the fused fold
    python benchmarks/auto_sweep.py --fold both               # both folds, the fold table
    python benchmarks/auto_sweep.py --no-partial-fill --markdown docs/auto-chunk.md  # the whole-request tables

``--fold`` sets the fold of the VPP runs (cpp and dcpp have none; docs/method.md, "The fused fold").
Every mode fills its batches as SGLang's prefill adder does: a batch starts the request that
overflows its budget in what is left (``ControllerConfig.partial_fill``). ``--no-partial-fill``
batches whole requests only; with ``--markdown`` it writes its tables between the
``auto_sweep_whole_requests`` markers, which the page's idle analysis reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sglang_vpp.cli.common import FILL_DEFAULT, FILL_HELP
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.errors import PresetError
from sglang_vpp.sim.idle import IDLE_CAUSES
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.sweep import simulate_matrix
from sglang_vpp.sim.workloads import build_workload

MODELS = ("deepseek-v3.1", "qwen3-coder-30b-a3b", "glm-5.2")
RANKS = (2, 4, 8)
WORKLOADS = ("long-64k", "long-256k", "long-1m", "short-4k", "short-16k", "mixed")
CHUNKS = tuple(n * 1024 for n in (4, 8, 12, 16, 24, 32, 48))
VPP_MODE = "vpp-stream"
BARRIER_MODE = "vpp-pack"
"""The fold-back mode with the request barrier, run with auto on the short cells for the idle table."""
MIXED_REQUESTS = 60
"""Mixed cells run 60 requests at the default concurrency (the default count takes minutes per cell on 2
cores; 60 is the size the pipeline-depth comparison of mixed traffic used)."""


def _workload(name: str):
    kind, _, size = name.partition("-")
    length = {"64k": 64 << 10, "256k": 256 << 10, "1m": 1 << 20, "4k": 4 << 10, "16k": 16 << 10}.get(size)
    if kind == "long":
        return build_workload("long", lengths=[length])
    if kind == "short":
        return build_workload("short", lengths=[length])  # the paper's 100 requests, the default
    if kind == "mixed":
        return build_workload("mixed", num_requests=MIXED_REQUESTS, seed=0)
    raise SystemExit(f"unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")


def _metrics(row) -> dict:
    s = row.result.sim
    return {"mode": row.result.mode, "chunk": "auto" if row.result.auto_sizes else row.result.chunk_size,
            "auto_sizes": sorted(set(row.result.auto_sizes)),
            "auto_fixed": sorted({n for n, t in zip(row.result.auto_sizes, row.result.auto_tapered) if not t}),
            "auto_tapered": sorted({n for n, t in zip(row.result.auto_sizes, row.result.auto_tapered) if t}),
            "ttft_s": s.ttft_s,
            "throughput_tok_s": s.throughput_tok_s, "bubble_s": s.bubble_s,
            "idle_by_cause_s": {c: s.idle_by_cause.get(c, 0.0) for c in IDLE_CAUSES}}


def run_cell(model_name: str, hardware: str, num_ranks: int, workload_name: str, vpp_mode: str = VPP_MODE,
             fold: str = "split", partial_fill: bool = FILL_DEFAULT) -> dict:
    model = load_model(model_name)
    cost = AnalyticCostModel(model, load_hardware(hardware))
    work = _workload(workload_name)
    sim = SimConfig(record_timeline=False)
    rows = simulate_matrix(work, cost, model.num_layers, f"cpp,dcpp,{vpp_mode}", list(CHUNKS), num_ranks, sim=sim,
                           fold=fold, partial_fill=partial_fill)
    rows += simulate_matrix(work, cost, model.num_layers, vpp_mode, ["auto"], num_ranks, sim=sim, fold=fold,
                            partial_fill=partial_fill)
    runs = [_metrics(r) for r in rows if r.result.sim.ok]
    base = [r for r in runs if r["mode"] in ("cpp", "dcpp")]
    vpp = [r for r in runs if r["mode"] == vpp_mode and r["chunk"] != "auto"]
    auto = next(r for r in runs if r["chunk"] == "auto")
    compare = None
    if workload_name.startswith("short") and vpp_mode != BARRIER_MODE:
        row = simulate_matrix(work, cost, model.num_layers, BARRIER_MODE, ["auto"], num_ranks, sim=sim, fold=fold,
                              partial_fill=partial_fill)[0]
        compare = _metrics(row) if row.result.sim.ok else None
    best = {
        "base_ttft": min(base, key=lambda r: r["ttft_s"]),
        "base_tput": max(base, key=lambda r: r["throughput_tok_s"]),
        "vpp_ttft": min(vpp, key=lambda r: r["ttft_s"]),
        "vpp_tput": max(vpp, key=lambda r: r["throughput_tok_s"]),
    }
    return {"model": model_name, "pp": num_ranks, "workload": workload_name, "fold": fold, "auto": auto, "best": best,
            "runs": runs, "compare": compare, "deadlocks": sum(not r.result.sim.ok for r in rows)}


def _pct_worse_ttft(auto: float, best: float) -> float:
    return 100.0 * (auto - best) / best


def _pct_worse_tput(auto: float, best: float) -> float:
    return 100.0 * (best - auto) / best


def _size(run: dict) -> str:
    chunk = run["chunk"]
    if chunk == "auto":
        labels = [f"{s // 1024}k" for s in run["auto_fixed"]] + [f"{s // 1024}k taper" for s in run["auto_tapered"]]
        return "/".join(labels) or "-"
    return f"{chunk // 1024}k"


def table(cells: list[dict]) -> str:
    """One line per cell; "+x%" is how much worse auto is (TTFT higher, throughput lower)."""
    head = ("| model | P | workload | auto size | TTFT auto s | vs cpp/dcpp | vs vpp best | "
            "tok/s auto | vs cpp/dcpp | vs vpp best |")
    lines = [head, "|" + "---|" * 10]
    for c in cells:
        a, b = c["auto"], c["best"]
        lines.append(
            f"| {c['model']} | {c['pp']} | {c['workload']} | {_size(a)} | {a['ttft_s']:.3f} | "
            f"{_pct_worse_ttft(a['ttft_s'], b['base_ttft']['ttft_s']):+.1f}% "
            f"({b['base_ttft']['mode']} {_size(b['base_ttft'])}) | "
            f"{_pct_worse_ttft(a['ttft_s'], b['vpp_ttft']['ttft_s']):+.1f}% ({_size(b['vpp_ttft'])}) | "
            f"{a['throughput_tok_s']:.0f} | "
            f"{_pct_worse_tput(a['throughput_tok_s'], b['base_tput']['throughput_tok_s']):+.1f}% "
            f"({b['base_tput']['mode']} {_size(b['base_tput'])}) | "
            f"{_pct_worse_tput(a['throughput_tok_s'], b['vpp_tput']['throughput_tok_s']):+.1f}% "
            f"({_size(b['vpp_tput'])}) |")
    return "\n".join(lines)


def fold_table(split: list[dict], fused: list[dict]) -> str:
    """The same cells with the split and the fused fold: auto's TTFT and throughput, each against
    the best of cpp and dcpp (which have no fold: the same runs both ways), and the change the
    fused fold makes to auto and to the VPP mode's best swept size ("-" = fused better in TTFT,
    "+" = fused better in throughput, as a change of the value)."""
    head = ("| model | P | workload | TTFT auto split / fused s | change | vs cpp/dcpp split / fused | "
            "best swept VPP TTFT change | tok/s auto split / fused | change | vs cpp/dcpp split / fused | "
            "best swept VPP tok/s change |")
    lines = [head, "|" + "---|" * 11]
    for a, b in zip(split, fused):
        assert (a["model"], a["pp"], a["workload"]) == (b["model"], b["pp"], b["workload"]), (a, b)
        ta, tb = a["auto"]["ttft_s"], b["auto"]["ttft_s"]
        pa, pb = a["auto"]["throughput_tok_s"], b["auto"]["throughput_tok_s"]
        base_t, base_p = a["best"]["base_ttft"]["ttft_s"], a["best"]["base_tput"]["throughput_tok_s"]
        vt = 100.0 * (b["best"]["vpp_ttft"]["ttft_s"] / a["best"]["vpp_ttft"]["ttft_s"] - 1)
        vp = 100.0 * (b["best"]["vpp_tput"]["throughput_tok_s"] / a["best"]["vpp_tput"]["throughput_tok_s"] - 1)
        lines.append(
            f"| {a['model']} | {a['pp']} | {a['workload']} | {ta:.3f} / {tb:.3f} | {100.0 * (tb / ta - 1):+.1f}% | "
            f"{_pct_worse_ttft(ta, base_t):+.1f}% / {_pct_worse_ttft(tb, base_t):+.1f}% | {vt:+.1f}% | "
            f"{pa:.0f} / {pb:.0f} | {100.0 * (pb / pa - 1):+.1f}% | "
            f"{_pct_worse_tput(pa, base_p):+.1f}% / {_pct_worse_tput(pb, base_p):+.1f}% | {vp:+.1f}% |")
    return "\n".join(lines)


def behind_base(cell: dict) -> bool:
    """auto is worse than the best of cpp and dcpp in TTFT or throughput."""
    a, b = cell["auto"], cell["best"]
    return (a["ttft_s"] > b["base_ttft"]["ttft_s"]
            or a["throughput_tok_s"] < b["base_tput"]["throughput_tok_s"])


def idle_cells(cells: list[dict]) -> list[dict]:
    """The cells the idle table explains: every short cell and every cell auto loses."""
    return [c for c in cells if c["workload"].startswith("short") or behind_base(c)]


def _idle_runs(cell: dict) -> list[tuple[str, dict]]:
    """auto, the barrier mode with auto when the cell ran it, and the best-throughput cpp/dcpp run."""
    runs = [(f"{cell['auto']['mode']} auto {_size(cell['auto'])}", cell["auto"])]
    if cell.get("compare"):
        runs.append((f"{cell['compare']['mode']} auto {_size(cell['compare'])}", cell["compare"]))
    base = cell["best"]["base_tput"]
    return runs + [(f"{base['mode']} {_size(base)}", base)]


def idle_table(cells: list[dict]) -> str:
    """Per run: TTFT, throughput and the bubble per rank by cause (s, mean over ranks)."""
    shown = [c for c in IDLE_CAUSES if any(abs(r["idle_by_cause_s"][c]) > 1e-9
                                           for cell in cells for _, r in _idle_runs(cell))]
    lines = ["| model | P | workload | run | TTFT s | tok/s | bubble s | " + " | ".join(shown) + " |",
             "|" + "---|" * (7 + len(shown))]
    for c in cells:
        for label, run in _idle_runs(c):
            causes = " | ".join(f"{run['idle_by_cause_s'][k]:.3f}" for k in shown)
            lines.append(f"| {c['model']} | {c['pp']} | {c['workload']} | {label} | {run['ttft_s']:.3f} | "
                         f"{run['throughput_tok_s']:.0f} | {run['bubble_s']:.3f} | {causes} |")
    return "\n".join(lines)


def grid_parser(description: str, workloads: tuple[str, ...]) -> argparse.ArgumentParser:
    """The options every simulator grid script shares: the preset and the cells to run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hardware", default="ascend-910c")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--pp", default=",".join(map(str, RANKS)))
    parser.add_argument("--workloads", default=",".join(workloads))
    parser.add_argument("--partial-fill", action=argparse.BooleanOptionalAction, default=FILL_DEFAULT,
                        help=f"Every mode. {FILL_HELP}")
    return parser


def batching(partial_fill: bool) -> tuple[str, str]:
    """The command-line flag and the sentence that say how a grid's runs batch requests."""
    if partial_fill:
        return "", "Every mode fills its batches as SGLang's prefill adder does."
    return " --no-partial-fill", "Every mode batches whole requests only."


def write_generated(path: Path, script: str, facts: str, seconds: float, legend: str, text: str,
                    partial_fill: bool) -> None:
    """Write a what-if's table to ``path`` under the command that made it, ``facts`` about the
    run, its time, how it batched and the ``legend``."""
    flag, batched = batching(partial_fill)
    path.write_text(f"Generated by `python benchmarks/{script}{flag} --markdown {path}` ({facts}, {seconds:.0f} s). "
                    f"{batched} {legend}\n\n{text}\n")


def grid_cells(args: argparse.Namespace, workloads: tuple[str, ...]) -> list[tuple[str, int, str]]:
    """(model, P, workload) of every cell ``grid_parser``'s options name, in table order; a bad
    name or P is refused here, before any cell runs."""
    models = args.models.split(",")
    for model in models:
        try:
            load_model(model)
        except PresetError as exc:
            raise SystemExit(f"--models: {exc}") from None
    try:
        ranks = [int(p) for p in args.pp.split(",")]
    except ValueError:
        raise SystemExit(f"--pp takes comma-separated integers, got {args.pp!r}") from None
    if not all(pp >= 1 for pp in ranks):
        raise SystemExit(f"--pp values must be >= 1, got {args.pp!r}")
    names = args.workloads.split(",")
    for name in names:
        if name not in workloads:
            raise SystemExit(f"--workloads: unknown workload {name!r}; valid: {', '.join(workloads)}")
    return [(model, pp, name) for model in models for pp in ranks for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = grid_parser(__doc__.splitlines()[0], WORKLOADS)
    parser.add_argument("--vpp-mode", default=VPP_MODE, help="the fold-back mode auto sizes (default %(default)s)")
    parser.add_argument("--fold", default="split", choices=("split", "fused", "both"),
                        help="fold of the VPP runs: split (the method's), fused, or both: each cell with "
                        "either fold and the fold table comparing them (default %(default)s)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path, help="write the tables into this file between the markers")
    args = parser.parse_args(argv)
    if args.fold != "split" and args.markdown:
        parser.error("--markdown writes docs/auto-chunk.md's tables, which are of the split fold (the default); "
                     "the fused fold's comparison (--fold both) goes to stdout (docs/method.md, \"The fused fold\")")
    folds = ("split", "fused") if args.fold == "both" else (args.fold,)
    runs: dict[str, list[dict]] = {fold: [] for fold in folds}
    started = time.perf_counter()
    for model, pp, workload in grid_cells(args, WORKLOADS):
        for fold in folds:
            t0 = time.perf_counter()
            runs[fold].append(run_cell(model, args.hardware, pp, workload, args.vpp_mode, fold, args.partial_fill))
            print(f"{model} P={pp} {workload} {fold}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    seconds = time.perf_counter() - started
    if args.fold == "both":
        print(f"{fold_table(runs['split'], runs['fused'])}\n\n{len(runs['split'])} cells, both folds, in "
              f"{seconds:.0f} s", file=sys.stderr)
        print(fold_table(runs["split"], runs["fused"]))
        if args.json:
            args.json.write_text(json.dumps({"hardware": args.hardware, "chunks": CHUNKS,
                                             "partial_fill": args.partial_fill, "cells": runs}, indent=1))
        return 0
    cells = runs[args.fold]
    out = f"{table(cells)}\n\nIdle by cause, short cells and cells auto loses:\n\n{idle_table(idle_cells(cells))}"
    print(out)
    print(f"\n{len(cells)} cells in {seconds:.0f} s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"hardware": args.hardware, "fold": args.fold, "chunks": CHUNKS,
                                         "partial_fill": args.partial_fill, "cells": cells}, indent=1))
    if args.markdown:
        given = "".join(f" --{name.replace('_', '-')} {getattr(args, name)}"
                        for name in ("hardware", "models", "pp", "workloads", "vpp_mode")
                        if getattr(args, name) != parser.get_default(name))
        _write_markdown(args.markdown, cells, args, given, seconds)
    return 0


BEGIN, END = "<!-- auto_sweep:begin -->", "<!-- auto_sweep:end -->"
WHOLE_BEGIN, WHOLE_END = "<!-- auto_sweep_whole_requests:begin -->", "<!-- auto_sweep_whole_requests:end -->"


def _replace_block(path: Path, begin: str, end: str, body: str) -> None:
    text = path.read_text() if path.exists() else f"{begin}\n{end}\n"
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no {begin} ... {end} block; add the two markers where the table goes")
    start, stop = text.index(begin), text.index(end) + len(end)
    path.write_text(text[:start] + f"{begin}\n{body}\n{end}" + text[stop:])


def _write_markdown(path: Path, cells: list[dict], args: argparse.Namespace, given: str, seconds: float) -> None:
    """The table and the idle table, under the command that made them (``given``: the options
    that differ from their defaults), between the markers of the run's batching: the default
    (partial fill) writes the main block, ``--no-partial-fill`` the whole-request one."""
    flag, batched = batching(args.partial_fill)
    body = (f"Generated by `python benchmarks/auto_sweep.py{given}{flag} --markdown {path}` ({args.hardware}, "
            f"{len(cells)} cells, {seconds:.0f} s on the 2-core dev machine). {batched} Swept sizes: "
            f"{', '.join(f'{c // 1024}k' for c in CHUNKS)}. Positive % = auto worse.\n\n{table(cells)}\n\n"
            f"Short cells and every cell where auto is behind cpp/dcpp, per run: mean TTFT, throughput and "
            f"bubble per rank by cause (s, mean over ranks):\n\n{idle_table(idle_cells(cells))}")
    begin, end = (BEGIN, END) if args.partial_fill else (WHOLE_BEGIN, WHOLE_END)
    _replace_block(path, begin, end, body)


if __name__ == "__main__":
    sys.exit(main())
