"""The numbers of ``schedule/cpu_cost.py``, from ``bench-serve --launch`` work directories.

    sglang-vpp bench-serve --launch cpp,vpp-pack --workload short --chunked-prefill-size auto \
        --repeats 3 --work-dir W/short --json W/short.json
    (the same with --workload long)
    python benchmarks/cpu_host_cost.py W/short.json W/long.json

Per JSON: each mode's host time per micro-batch and per forward (``runs[i].host_time``: per rank,
min / median / max over repeats). Then, from the vpp-pack traces of the work directories, the
fitted-cost fit (``sim.cost.fitted.fit_coefficients``: ``FittedCostModel``'s form, the one
cpu_cost.py's estimate evaluates) of a middle stage's prefill compute (thread CPU time), with each
micro-batch's tokens ``c`` and prefix ``L`` from the rank-0 ``admit`` decisions of one-request
micro-batches (rank 1's stages hold no embedding or head, so they are the per-layer cost). Prints
the values to put in cpu_cost.py.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from sglang_vpp.schedule.fitted_cost import Coefficients
from sglang_vpp.sim.cost.fitted import fit_coefficients
from sglang_vpp.sim.cost.samples import CostSample


def host_lines(doc: dict) -> list[str]:
    out = []
    for run in doc["runs"]:
        host = run.get("host_time")
        if not host:
            out.append(f"{run['label']}: no host time")
            continue
        for key in ("per_micro_batch_ms", "per_forward_ms"):
            cells = "  ".join(f"r{k} {s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]" for k, s in enumerate(host[key]))
            out.append(f"{run['label']:9} {key:19} {cells}")
    return out


def fit_samples(trace_dir: Path, layers_per_stage: int) -> list[CostSample]:
    """Rank 1's prefill computes as cost samples (``admit`` records give c and L)."""
    rank0 = json.loads((trace_dir / "vpp_rank0.records.json").read_text())
    rank1 = json.loads((trace_dir / "vpp_rank1.records.json").read_text())
    # One request per micro-batch only: a batch's record has its total tokens and longest prefix.
    shape = {d["seq"]: (d["tokens"], d["start"]) for d in rank0["decisions"]
             if d["kind"] == "admit" and d["prefill"] and len(d["requests"]) == 1}
    out = []
    for record in rank1["records"]:
        if not record["is_prefill"] or record["seq"] not in shape:
            continue
        tokens, prefix = shape[record["seq"]]
        out.append(CostSample("compute", 1, 0, record["seq"], prefix, tokens, record["cpu_s"], layers_per_stage))
    return out


def fit(samples: list[CostSample], layers_per_stage: int) -> tuple[Coefficients, float, float]:
    """The stage fit, and its ``a`` and ``b`` per layer (cpu_cost.py's ``PAIR_PER_LAYER_S``,
    ``CONTEXT_PER_LAYER_S``; ``d`` is the stage call's, ``STAGE_CALL_S``)."""
    stage = fit_coefficients(samples)
    return stage, stage.a / layers_per_stage, stage.b / layers_per_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="bench-serve --launch --json files (work dir alongside)")
    parser.add_argument("--layers-per-stage", type=int, default=2, help="8 layers over 2P = 4 virtual stages")
    args = parser.parse_args()
    samples = []
    gaps = []
    for path in args.json:
        doc = json.loads(path.read_text())
        print(path)
        print("\n".join(host_lines(doc)))
        for run in doc["runs"]:
            if run["label"] == "vpp-pack" and run.get("host_time"):
                gaps += [s[x] for s in run["host_time"]["per_forward_ms"] for x in ("min", "median", "max")]
        trace = Path(doc["runs"][0]["config"]["launch"]["log"]).parent / "trace-vpp-pack"
        if trace.is_dir():
            samples += fit_samples(trace, args.layers_per_stage)
    if gaps:
        print(f"vpp-pack host gap per forward, ms: median of all {statistics.median(gaps):.3f}, "
              f"range {min(gaps):.3f}-{max(gaps):.3f}")
    if len(samples) >= 3:
        stage, pair, context = fit(samples, args.layers_per_stage)
        print(f"fit on {len(samples)} rank-1 prefill computes (relative RMS residual {stage.rel_rmse:.0%}): "
              f"PAIR_PER_LAYER_S {pair:.3e}, CONTEXT_PER_LAYER_S {context:.3e}, STAGE_CALL_S {stage.d:.3e}")


if __name__ == "__main__":
    main()
