"""``benchmarks/decode_causes.py`` on hand-made trace records: the per-rank decode numbers and
the decode model's prediction from a fitted per-forward cost."""

import json

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def causes():
    return load_benchmark("decode_causes")


def _record(rank, stage, seq, start, end, prefill=False, tokens=4):
    return {"rank": rank, "stage": stage, "seq": seq, "is_prefill": prefill, "num_tokens": tokens,
            "start_s": start, "end_s": end, "cpu_s": end - start}


def test_rank_summary_splits_the_decode_window_and_times_a_fold_back_trip(causes):
    # Rank 0 of a P = 2 fold-back pipeline: two decode micro-batches (stage 0, 0.3 s away, then
    # stage 3: a 0.5 s trip each) and a prefill forward, over a 1.0 s decode window.
    records = [_record(0, 0, 1, 0.0, 0.1), _record(0, 3, 1, 0.4, 0.5), _record(0, 0, 2, 0.5, 0.6, tokens=2),
               _record(0, 0, 3, 0.6, 0.8, prefill=True, tokens=64), _record(0, 3, 2, 0.9, 1.0, tokens=2)]
    s = causes.rank_summary(records, last_stage=3)
    assert (s["decode_micro_batches"], s["requests_per_micro_batch"], s["forwards_per_micro_batch"]) == (2, 3, 2)
    assert s["ms_per_decode_forward"] == pytest.approx(100)
    assert (s["share_decode"], s["share_prefill"], s["share_waiting"]) == pytest.approx((0.4, 0.2, 0.4))
    assert s["trip_ms"] == pytest.approx(500) and s["away_from_rank0_ms"] == pytest.approx(300)
    assert causes.rank_summary([_record(0, 0, 1, 0, 1, prefill=True)], None) == {"decode_micro_batches": 0}


def test_prediction_fits_fixed_and_per_layer_cost_from_both_modes(causes, tmp_path):
    # 8 layers, P = 2: a cpp forward (4 layers) 50 ms, a fold-back one (2 layers) 30 ms, so
    # fixed 10 ms + 10 ms per layer. 8 requests in 2 micro-batches: cpp rounds 2 x 50 = 100 ms;
    # vpp-pack 2 x 2 x 30 = 120 ms: 20 ms more, P = 2 fixed costs.
    def trace(name, forward_s, stages):
        root = tmp_path / name
        root.mkdir()
        for rank in range(2):
            records = [_record(rank, stage, seq, seq, seq + forward_s) for seq in range(3) for stage in stages[rank]]
            controller = {"mode": name} if len(stages[0]) == 2 else {}
            (root / f"vpp_rank{rank}.records.json").write_text(json.dumps({"records": records,
                                                                            "controller": controller}))
        return causes.trace_summary(root)

    stock = trace("cpp", 0.05, [[0], [1]])
    fold = trace("vpp-pack", 0.03, [[0, 3], [1, 2]])
    p = causes.predict(("cpp", stock), ("vpp-pack", fold), num_layers=8, running=8)
    assert (p["fixed_ms"], p["per_layer_ms"]) == pytest.approx((10, 10))
    assert (p["cpp_itl_ms"], p["vpp-pack_itl_ms"], p["difference_ms"]) == pytest.approx((100, 120, 20))


def test_prediction_of_a_fused_fold_fits_on_the_two_stage_ranks(causes, tmp_path):
    # P = 2, 8 layers, fused fold: rank 0 runs stages 0 and 2 (2 layers each, 30 ms), rank 1 one
    # stage of 4 layers (50 ms, as cpp's). The fit must use rank 0's forwards only (fixed 10 ms,
    # 10 ms per layer) and the estimate one forward per micro-batch on rank 1.
    def trace(name, stages, forward_s, controller):
        root = tmp_path / name
        root.mkdir()
        for rank in range(2):
            records = [_record(rank, stage, seq, seq, seq + forward_s[rank]) for seq in range(3) for stage in stages[rank]]
            (root / f"vpp_rank{rank}.records.json").write_text(json.dumps({"records": records, "controller": controller}))
        return root

    stock = trace("cpp", [[0], [1]], [0.05, 0.05], {})
    fused = trace("vpp-pack", [[0, 2], [1]], [0.03, 0.05], {"mode": "vpp-pack", "fold": "fused"})
    assert causes.trace_fold(fused) is causes.Fold.FUSED and causes.trace_fold(stock) is causes.Fold.SPLIT
    summary = causes.trace_summary(fused)
    assert summary[0]["forwards_per_micro_batch"] == 2 and summary[0]["trip_ms"] > 0  # last stage 2
    p = causes.predict(("cpp", causes.trace_summary(stock)), ("vpp-pack", summary), num_layers=8, running=8,
                       fold_kind=causes.trace_fold(fused))
    assert (p["fixed_ms"], p["per_layer_ms"]) == pytest.approx((10, 10))
    # Rank 0 still runs 2 x 30 ms per micro-batch, 2 micro-batches a round: it bounds the round
    # (rank 1: 2 x 50 ms); the fused fold shortens the trip, not this round.
    assert p["vpp-pack_itl_ms"] == pytest.approx(120)
