"""Every ``--pp-mode`` of a real SGLang server on one 12-chunk prompt: per-rank prefill idle.

Runs ``sglang-vpp bench-serve --launch`` (one server per mode, one at a time), then renders the
per-rank idle spread (min / median / max over repeats) as a markdown table. The idle is replayed
from each stage compute's thread CPU time as if every rank had its own device; it is a derived
timeline, never a wall-clock measurement of this machine.

    python benchmarks/serve_modes.py --chunk 256 --chunks 12 --repeats 5 --out benchmarks/results/serve_modes

Writes OUT.json (the bench-serve JSON) and OUT.md (the table), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MODES = "cpp,dcpp,vpp,vpp-async,vpp-pack"


def render(report: dict, chunk: int, chunks: int) -> str:
    lines = [
        f"Prompt of {chunk * chunks} tokens = {chunks} chunks of {chunk}; per-rank prefill idle replayed from "
        "per-stage thread CPU time (dedicated-hardware estimate, transfers cost 0); min / median / max over "
        "repeats. Min-cost replay: each stage compute's minimum CPU time over the repeats, replayed once "
        "(interference only adds time; '-' where repeats differ in shape, e.g. dcpp). TTFT is wall clock on "
        "this shared machine and is not a pipeline claim.",
        "",
        "| mode | rank | idle ms (min / median / max) | idle share (median) | min-cost replay idle ms (share) "
        "| micro-batches | TTFT median s |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        ttft = run["summary"]["ttft_ms"]["median"] / 1e3 if run["summary"]["ttft_ms"] else float("nan")
        batches = sorted({r["num_micro_batches"] for r in run["pipeline"]["per_repeat"]})
        min_cost = run["pipeline"].get("min_cost")
        for rank in run["pipeline"]["idle_spread"]:
            idle = rank["idle_s"]
            best = "-"
            if min_cost:
                r = min_cost["ranks"][rank["rank"]]
                best = f"{r['idle_s'] * 1e3:.0f} ({r['idle_fraction']:.1%})"
            lines.append(
                f"| {run['label']} | {rank['rank']} | {idle['min'] * 1e3:.0f} / {idle['median'] * 1e3:.0f} / "
                f"{idle['max'] * 1e3:.0f} | {rank['idle_fraction']['median']:.1%} | {best} | "
                f"{','.join(map(str, batches))} | {ttft:.3f} |"
            )
        for note in run.get("notes") or []:
            lines.append(f"| {run['label']} | note | {note} | | | | |")
    for verdict in report.get("verdicts") or []:
        lines += ["", f"{verdict['headline']}", ""]
        lines += [f"- {c['mode']} vs {c['baseline']}: {c['relative_median']:+.1%} "
                  f"[{c['relative_min']:+.1%} .. {c['relative_max']:+.1%}] -> {c['outcome']}"
                  for c in verdict["comparisons"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=MODES)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model-path", default=None, help="default: bench-serve's tiny 8-layer Qwen2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve_modes"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path = args.out.with_suffix(".json")
    cmd = [
        sys.executable, "-m", "sglang_vpp.cli.app", "bench-serve", "--launch", args.modes,
        "--pp-size", "2", "--chunked-prefill-size", str(args.chunk), "--workload", "long",
        "--num-requests", "1", "--input-len", str(args.chunk * args.chunks), "--output-len", "2",
        "--repeats", str(args.repeats), "--json", str(json_path), "--no-progress",
    ]  # fmt: skip
    if args.model_path:
        cmd += ["--model-path", args.model_path]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        return done.returncode
    table = render(json.loads(json_path.read_text()), args.chunk, args.chunks)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
