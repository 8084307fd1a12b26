"""Where a served mode's decode time goes, from a server's ``--vpp-trace`` records.

For each trace directory (``bench-serve --launch`` keeps one per mode: ``WORK_DIR/trace-MODE``)
and each rank: the decode micro-batches and their mean size (requests), the decode forwards the
rank ran per micro-batch (1 under stock PP, 2 under fold-back), the mean wall time of one
decode forward, and, over the window from the rank's first to its last decode forward, the
share of the rank's time in decode forwards, prefill forwards and neither (waiting: for a peer's
stage, a hop, or the host between forwards). On rank 0 of a fold-back mode, which runs a
micro-batch's first and last stage, also the mean trip of a decode micro-batch (its stage 0
start to its last stage end) and the part of it spent away from rank 0 (the other ranks'
stages and the hops). Records of every pass the server ran are counted (warm-up included).

With ``--predict MODE=DIR,MODE=DIR`` (stock PP first, then a fold-back mode) the simulator's
decode model (``sim.decode.estimate_decode``) is fed a cost model fitted to the two traces'
mean decode forward times (the busiest rank's): a forward of a stage of ``n`` layers costs
``fixed + n * per_layer``, two equations for the stock stage (L/P layers) and the fold-back
stage (L/2P); it prints both modes' predicted ITL and the difference.

    python benchmarks/decode_causes.py WORK_DIR/trace-cpp WORK_DIR/trace-vpp-pack
    python benchmarks/decode_causes.py --predict cpp=A/trace-cpp,vpp-pack=A/trace-vpp-pack \
        --layers 8 --running 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from sglang_vpp.schedule import Fold, StageCostModel
from sglang_vpp.sim.decode import estimate_decode
from sglang_vpp.trace_records import RECORDS_GLOB, rank_of_records_file


class PerForwardCost(StageCostModel):
    """A decode forward of a stage: ``fixed + layers * per_layer`` seconds, whatever its size."""

    def __init__(self, fixed: float, per_layer: float) -> None:
        self.fixed, self.per_layer = fixed, per_layer

    def stage_cost(self, stage, chunk) -> float:
        return self.fixed + stage.num_layers * self.per_layer


def predict(stock: tuple[str, dict], fold: tuple[str, dict], num_layers: int, running: int,
            fold_kind: Fold = Fold.SPLIT) -> dict:
    """Both modes' ITL from ``estimate_decode`` with the cost fitted to their traces (module doc).
    ``fold_kind``: the fold-back server's fold; a fused fold's last rank runs stages of L/P layers,
    so only the other ranks' forwards fit the L/2P equation."""
    (stock_mode, stock_ranks), (fold_mode, fold_ranks) = stock, fold
    pp = len(stock_ranks)
    t_stock = max(r.get("ms_per_decode_forward", 0.0) for r in stock_ranks.values()) / 1000
    two_stage_ranks = [r for rank, r in fold_ranks.items() if fold_kind is Fold.SPLIT or rank != pp - 1]
    t_fold = max(r.get("ms_per_decode_forward", 0.0) for r in two_stage_ranks) / 1000
    # t_stock = f + (L/P) c and t_fold = f + (L/2P) c.
    per_layer = (t_stock - t_fold) / (num_layers / (2 * pp))
    fixed = t_fold - num_layers / (2 * pp) * per_layer
    cost = PerForwardCost(max(fixed, 0.0), max(per_layer, 0.0))
    a = estimate_decode(stock_mode, pp, num_layers, cost, running, 0)
    b = estimate_decode(fold_mode, pp, num_layers, cost, running, 0, fold=fold_kind)
    return {"fixed_ms": 1000 * cost.fixed, "per_layer_ms": 1000 * cost.per_layer,
            f"{stock_mode}_itl_ms": 1000 * a.itl_s, f"{fold_mode}_itl_ms": 1000 * b.itl_s,
            "difference_ms": 1000 * (b.itl_s - a.itl_s), "bound": b.bound}


def rank_summary(records: list[dict], last_stage: int | None) -> dict:
    """The numbers of the module doc for one rank's compute records."""
    decode = [r for r in records if not r["is_prefill"]]
    if not decode:
        return {"decode_micro_batches": 0}
    seqs = sorted({r["seq"] for r in decode})
    first = min(r["start_s"] for r in decode)
    last = max(r["end_s"] for r in decode)
    window = [r for r in records if r["end_s"] > first and r["start_s"] < last]
    span = last - first

    def busy(items: list[dict]) -> float:
        return sum(min(r["end_s"], last) - max(r["start_s"], first) for r in items)

    decode_busy = busy([r for r in window if not r["is_prefill"]])
    prefill_busy = busy([r for r in window if r["is_prefill"]])
    sizes = {r["seq"]: r["num_tokens"] for r in decode}
    out = {
        "decode_micro_batches": len(seqs),
        "requests_per_micro_batch": statistics.mean(sizes.values()),
        "forwards_per_micro_batch": len(decode) / len(seqs),
        "ms_per_decode_forward": 1000 * statistics.mean(r["end_s"] - r["start_s"] for r in decode),
        "decode_window_s": span,
        "share_decode": decode_busy / span if span else 0.0,
        "share_prefill": prefill_busy / span if span else 0.0,
        "share_waiting": 1 - (decode_busy + prefill_busy) / span if span else 0.0,
    }
    if last_stage is not None:
        trips, away = [], []
        by_seq: dict[int, list[dict]] = {}
        for r in decode:
            by_seq.setdefault(r["seq"], []).append(r)
        for items in by_seq.values():
            starts = [r for r in items if r["stage"] == 0]
            ends = [r for r in items if r["stage"] == last_stage]
            if starts and ends:
                trip = ends[0]["end_s"] - starts[0]["start_s"]
                trips.append(trip)
                away.append(ends[0]["start_s"] - starts[0]["end_s"])
        if trips:
            out["trip_ms"] = 1000 * statistics.median(trips)
            out["away_from_rank0_ms"] = 1000 * statistics.median(away)
    return out


def _load_ranks(trace_dir: Path) -> dict[int, dict]:
    files = sorted(trace_dir.glob(RECORDS_GLOB))
    if not files:
        raise ValueError(f"no {RECORDS_GLOB} in {str(trace_dir)!r}; pass a directory a server wrote with --vpp-trace")
    return {rank_of_records_file(path): json.loads(path.read_text()) for path in files}


def trace_fold(trace_dir: Path) -> Fold:
    """The fold a fold-back server ran (split for stock PP, which records no controller)."""
    controller = _load_ranks(trace_dir)[0].get("controller") or {}
    return Fold(controller.get("fold", Fold.SPLIT))


def trace_summary(trace_dir: Path) -> dict[int, dict]:
    ranks = _load_ranks(trace_dir)
    # Rank 0 of a fold-back pipeline runs the first and the last stage (2P-1, or 2P-2 under a
    # fused fold): one per recorded stage's layer count; a trace without them, the highest stage
    # rank 0 ran.
    controller = ranks[0].get("controller") or {}
    if "stage_layers" in controller:
        last_stage = len(controller["stage_layers"]) - 1
    else:
        last_stage = max((r["stage"] for r in ranks[0].get("records") or []), default=None) if controller else None
    return {rank: rank_summary(data.get("records") or [], last_stage if rank == 0 else None)
            for rank, data in sorted(ranks.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dirs", nargs="*", type=Path)
    parser.add_argument("--predict", help="STOCK_MODE=DIR,FOLD_MODE=DIR: the decode model's ITL")
    parser.add_argument("--layers", type=int, default=8, help="model layers (default 8: the tiny Qwen2)")
    parser.add_argument("--running", type=int, default=8, help="running requests (default 8)")
    args = parser.parse_args(argv)
    if args.predict:
        pairs = [item.split("=", 1) for item in args.predict.split(",")]
        if len(pairs) != 2 or any(len(p) != 2 for p in pairs):
            print(f"--predict {args.predict!r}: expected STOCK_MODE=DIR,FOLD_MODE=DIR", file=sys.stderr)
            return 2
        (m1, d1), (m2, d2) = pairs
        numbers = predict((m1, trace_summary(Path(d1))), (m2, trace_summary(Path(d2))), args.layers, args.running,
                          trace_fold(Path(d2)))
        for key, value in numbers.items():
            print(f"{key:28} {value:.3g}" if isinstance(value, float) else f"{key:28} {value}")
    for trace_dir in args.trace_dirs:
        try:
            summary = trace_summary(trace_dir)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(trace_dir.name)
        for rank, numbers in summary.items():
            print(f"  rank {rank}")
            for key, value in numbers.items():
                print(f"    {key:28} {value:.3g}" if isinstance(value, float) else f"    {key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
