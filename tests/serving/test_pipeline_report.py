"""Replay of measured per-stage CPU times on the engine and the trace-file reader (no server needed)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from sglang_vpp.schedule import build_layout
from sglang_vpp.serving.pipeline_report import (
    TraceUnavailableError,
    measure_idle,
    last_seq,
    min_cost_idle,
    read_records,
    wait_for_records,
)
from sglang_vpp.serving.record_replay import IncompleteRecordsError, records_schedule, replay_window


def _rec(rank, stage, seq, start, cpu, prefill=True):
    return {"rank": rank, "stage": stage, "seq": seq, "start_s": start, "cpu_s": cpu, "is_prefill": prefill,
            "num_tokens": 64}


def _cpp_records(costs):
    """Stock 2-rank pipeline, chunk k costs costs[k] on each rank, executed in order."""
    out = []
    for k, c in enumerate(costs):
        out += [_rec(0, 0, k, 10 * k, c), _rec(1, 1, k, 10 * k + 5, c)]
    return out


def test_cpp_replay_has_the_textbook_bubbles():
    # Growing costs: rank 1 waits for chunk 0, then each step for the growth; rank 0 waits at the end.
    costs = [1.0, 2.0, 3.0]
    replay = replay_window(_cpp_records(costs), 2)
    ranks = replay.ranks
    assert [r.busy_s for r in ranks] == [6.0, 6.0]
    assert ranks[0].makespan_s == 9.0  # 1+2+3 on rank 0, then the last chunk on rank 1
    assert ranks[0].idle_s == 3.0 and ranks[1].idle_s == 3.0
    # The Gantt's spans are the same replay: rank 1 starts chunk k when rank 0 has finished it.
    spans = replay.spans
    assert spans[0] == [(0.0, 1.0, 0, 0), (1.0, 3.0, 0, 1), (3.0, 6.0, 0, 2)]
    assert spans[1] == [(1.0, 2.0, 1, 0), (3.0, 5.0, 1, 1), (6.0, 9.0, 1, 2)]


def test_foldback_replay_respects_stage_order_and_rank_order():
    # P=2 fold-back, one micro-batch: s0 (r0) -> s1 (r1) -> s2 (r1) -> s3 (r0).
    recs = [_rec(0, 0, 0, 0, 1.0), _rec(1, 1, 0, 1, 1.0), _rec(1, 2, 0, 2, 1.0), _rec(0, 3, 0, 3, 1.0)]
    ranks = replay_window(recs, 2).ranks
    assert ranks[0].makespan_s == 4.0
    assert ranks[0].idle_s == 2.0 and ranks[1].idle_s == 2.0


def test_records_of_a_fused_fold_replay_on_the_fused_layout():
    # P=2, fused fold: s0 (r0) -> s1 (r1, one forward for both layer ranges) -> s2 (r0).
    recs = [_rec(0, 0, 0, 0, 1.0), _rec(1, 1, 0, 1, 2.0), _rec(0, 2, 0, 3, 1.0)]
    schedule, _ = records_schedule(recs, 2)
    assert str(schedule.layout.fold) == "fused" and schedule.layout.num_stages == 3
    ranks = replay_window(recs, 2).ranks
    assert ranks[0].makespan_s == 4.0 and ranks[1].busy_s == 2.0
    # The split fold's records still read as split.
    split = [_rec(0, 0, 0, 0, 1.0), _rec(1, 1, 0, 1, 1.0), _rec(1, 2, 0, 2, 1.0), _rec(0, 3, 0, 3, 1.0)]
    assert str(records_schedule(split, 2)[0].layout.fold) == "split"


@pytest.mark.parametrize("num_ranks", [2, 3, 5])
@pytest.mark.parametrize("fold", ["split", "fused"])
def test_records_read_as_the_fold_whose_ranks_they_ran_on(num_ranks, fold):
    layout = build_layout(num_ranks, 2 * num_ranks, "foldback", fold=fold)
    recs = [_rec(s.rank, s.stage_index, 0, s.stage_index, 1.0) for s in layout.stages]
    assert records_schedule(recs, num_ranks)[0].layout == layout
    # A window cut after the first stage past the fold still tells the folds apart.
    assert records_schedule(recs[:num_ranks + 1], num_ranks)[0].layout == layout


def test_a_stage_consumed_out_of_its_send_order_keeps_each_computes_own_dependency():
    # Rank 1 runs mb 1 before mb 0: each waits only for its own input (the server's inbox takes
    # messages by key), though the engine pairs a link's operations in order.
    recs = [_rec(0, 0, 0, 0, 1.0), _rec(0, 0, 1, 1, 1.0), _rec(1, 1, 1, 2, 1.0), _rec(1, 1, 0, 3, 1.0)]
    assert replay_window(recs, 2).spans[1] == [(2.0, 3.0, 1, 1), (3.0, 4.0, 1, 0)]
    schedule, seq_of = records_schedule(recs, 2)
    assert [str(a) for a in schedule.rank_actions[1]] == ["0RECV_F0.0<0@fwd", "0RECV_F0.1<0@fwd", "1F0.1", "1F0.0"]
    assert seq_of == {0: 0, 1: 1} and [c.start for c in schedule.chunks] == [0, 64]


def test_a_cycle_in_the_records_is_an_error_not_a_hang():
    # Fold-back: rank 0 runs stage 3 of mb 0 before its stage 0, which stage 3 needs (via ranks 1's
    # stages 1 and 2): the engine's deadlock check reports the cycle.
    recs = [_rec(0, 3, 0, 0, 1.0), _rec(0, 0, 0, 1, 1.0), _rec(1, 1, 0, 2, 1.0), _rec(1, 2, 0, 3, 1.0)]
    with pytest.raises(IncompleteRecordsError, match="cycle"):
        replay_window(recs, 2)


def test_a_stage_on_a_rank_the_layout_does_not_give_it_is_an_error():
    recs = [_rec(0, 0, 0, 0, 1.0), _rec(0, 1, 0, 1, 1.0)]
    with pytest.raises(IncompleteRecordsError, match="stage 1 on rank 0.*gives it rank 1"):
        replay_window(recs, 2)
    with pytest.raises(IncompleteRecordsError, match="stage 0 of micro-batch 0 is recorded twice"):
        replay_window([_rec(0, 0, 0, 0, 1.0), _rec(0, 0, 0, 1, 1.0)], 2)


def test_measure_idle_keeps_prefill_after_the_snapshot():
    recs = _cpp_records([1.0, 1.0, 1.0]) + [_rec(0, 0, 3, 40, 0.1, prefill=False), _rec(1, 1, 3, 41, 0.1, prefill=False)]
    idle = measure_idle(recs, 2, after_seq=0)
    assert idle.num_micro_batches == 2 and idle.num_prefill_computes == 4
    data = idle.to_json()
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and "replayed" in data["method"]


def _write(trace_dir: Path, rank: int, records):
    path = trace_dir / f"vpp_rank{rank}.records.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"summary": {}, "counters": {}, "records": records}))
    os.replace(tmp, path)


def test_wait_for_records_waits_for_fresh_settled_files(tmp_path: Path):
    _write(tmp_path, 0, [_rec(0, 0, 0, 0, 1.0)])
    _write(tmp_path, 1, [_rec(1, 1, 0, 0, 1.0)])
    assert last_seq(read_records(tmp_path, 2)) == 0
    began = time.time() + 0.05
    time.sleep(0.1)

    def later():
        time.sleep(0.3)
        _write(tmp_path, 0, [_rec(0, 0, 0, 0, 1.0), _rec(0, 0, 1, 1, 1.0)])
        _write(tmp_path, 1, [_rec(1, 1, 0, 0, 1.0), _rec(1, 1, 1, 1, 1.0)])

    writer = threading.Thread(target=later)
    writer.start()
    records = wait_for_records(tmp_path, 2, since=began, timeout=10, settle=0.3)
    writer.join()
    assert len(records) == 4


def test_missing_trace_is_a_clear_error(tmp_path: Path):
    with pytest.raises(TraceUnavailableError, match="--vpp-trace"):
        wait_for_records(tmp_path, 2, since=time.time(), timeout=0.5, settle=0.1)


def test_min_cost_replay_takes_each_computes_minimum_over_repeats():
    quiet = _cpp_records([1.0, 2.0, 3.0])
    noisy = [dict(r, seq=r["seq"] + 10, cpu_s=r["cpu_s"] * (5 if r["seq"] == 1 else 1)) for r in quiet]
    runs = [measure_idle(noisy, 2), measure_idle(quiet, 2)]
    best = min_cost_idle(runs)
    assert best is not None and best.num_prefill_computes == 6 and "minimum" in best.method
    assert [r.busy_s for r in best.ranks] == [6.0, 6.0]  # the quiet costs, whichever repeat had them
    assert best.ranks[1].idle_s == 3.0


def test_min_cost_replay_refuses_repeats_of_different_shape():
    runs = [measure_idle(_cpp_records([1.0, 2.0]), 2), measure_idle(_cpp_records([1.0, 2.0, 3.0]), 2)]
    assert min_cost_idle(runs) is None
    assert min_cost_idle(runs[:1]) is None


def _stage_records(num_stages: int, per_layer: float, layers: int, micro_batches: int = 6) -> list[dict]:
    """Prefill records of 64-token micro-batches on 2 ranks. Contiguous (2 stages): each rank in
    micro-batch order. Fold-back (4 stages): rank 1 runs stages 1 and 2 of a micro-batch back to
    back; rank 0 starts two micro-batches, then pairs stage 3 of mb k-1 with stage 0 of mb k+1."""
    n = micro_batches
    if num_stages == 2:
        order = {0: [(0, q) for q in range(n)], 1: [(1, q) for q in range(n)]}
    else:
        order = {0: [(0, 0), (0, 1)] + [x for k in range(1, n - 1) for x in ((3, k - 1), (0, k + 1))]
                 + [(3, n - 2), (3, n - 1)],
                 1: [x for q in range(n) for x in ((1, q), (2, q))]}
    return [{"rank": rank, "stage": stage, "seq": seq, "num_tokens": 64, "is_prefill": True,
             "start_s": float(t), "cpu_s": layers * per_layer * (1 + 0.1 * seq)}
            for rank, items in order.items() for t, (stage, seq) in enumerate(items)]


def test_equal_cost_replay_times_every_mode_on_one_cost_model():
    """cpp's 4-layer stages measured 40 % dearer per layer than vpp's 2-layer stages (cache effects,
    not the schedule): the own-cost replays differ by a third, the shared model by the schedule only."""
    from sglang_vpp.schedule import build_layout, get_policy
    from sglang_vpp.serving.pipeline_report import EQUAL_COST_METHOD, equal_cost_idle

    layouts = {mode: build_layout(2, 8, get_policy(mode).layout_kind) for mode in ("cpp", "vpp")}
    idle = {"cpp": [measure_idle(_stage_records(2, 1.4, 4), 2) for _ in range(3)],
            "vpp": [measure_idle(_stage_records(4, 1.0, 2), 2) for _ in range(3)]}

    def makespan(run):
        return max(rank.makespan_s for rank in run.ranks)

    own = makespan(idle["vpp"][0]) / makespan(idle["cpp"][0]) - 1
    shared, models = equal_cost_idle(idle, layouts)
    assert len(models) == 3 and all(len(runs) == 3 for runs in shared.values())
    equal = makespan(shared["vpp"][0]) / makespan(shared["cpp"][0]) - 1
    assert own < -0.3 and -0.15 < equal < 0, (own, equal)
    assert shared["cpp"][0].method == EQUAL_COST_METHOD
    # One cost per layer for both modes: a 4-layer compute costs what two 2-layer ones do.
    def durations(run):
        return {(stage, seq): end - start for spans in run.spans.values() for start, end, stage, seq in spans}

    cpp, vpp = durations(shared["cpp"][0]), durations(shared["vpp"][0])
    for seq in range(6):
        assert cpp[(0, seq)] == pytest.approx(vpp[(0, seq)] + vpp[(1, seq)], rel=1e-6)


def test_launch_report_compares_modes_on_the_shared_cost_model(tmp_path, monkeypatch, capsys):
    """bench-serve --launch's table, Gantt spans and pipeline verdict come from the equal-cost
    replay: cpp's own CPU times are 40 % dearer per layer, yet on one cost model vpp is within the
    schedule's difference, and the verdict says which metric and which rule it applies."""
    import typer

    from sglang_vpp.cli import bench_serve_launch, bench_serve_report
    from sglang_vpp.cli.bench_serve_launch import LaunchedRun, LaunchSpec
    from sglang_vpp.serving.bench_serving import LoadPlan, ServingPass, Workload

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    records = {"cpp": lambda: _stage_records(2, 1.4, 4), "vpp": lambda: _stage_records(4, 1.0, 2)}

    def fake_run_launched(spec, modes, **_kwargs):
        passes = [ServingPass({"duration": 1.0, "median_ttft_ms": 100.0 + r}, ttfts=[0.1], itls=[[0.01]],
                              input_lens=[8], output_lens=[2], errors=[""]) for r in range(3)]
        return [LaunchedRun(mode, "http://x", "log", 1.0, passes, [measure_idle(records[mode](), 2)] * 3)
                for mode in modes]

    monkeypatch.setattr(bench_serve_launch, "run_launched", fake_run_launched)
    spec = LaunchSpec(model_dir=str(model), pp_size=2, chunked_prefill_size=64)
    plan = LoadPlan(Workload.LONG, 1, 768, 2, 1, progress=False)
    out = tmp_path / "out.json"
    bench_serve_report.bench_launched(["cpp", "vpp"], spec, plan, 3, tmp_path, out, None, None, "table")
    text = capsys.readouterr().out
    assert "equal-cost makespan s" in text and "verdict (equal-cost prefill makespan" in text
    assert "significant: |median| >= 1%" in text and "min-max ranges over repeats do not overlap" in text
    report = json.loads(out.read_text())
    shared = {run["label"]: run["pipeline"]["equal_cost"]["makespan_s"] for run in report["runs"]}
    own = {run["label"]: run["pipeline"]["replayed_makespan_s"] for run in report["runs"]}
    assert own["vpp"][0] / own["cpp"][0] - 1 < -0.3 < shared["vpp"][0] / shared["cpp"][0] - 1 < 0
    comparison = report["verdicts"][0]["comparisons"][0]
    assert comparison["relative_median"] == pytest.approx(shared["vpp"][0] / shared["cpp"][0] - 1)
    assert len(report["equal_cost_models"]) == 3
    with pytest.raises(typer.Exit):  # a failed request: no verdict, exit 1
        monkeypatch.setattr(ServingPass, "num_failed", property(lambda self: 1))
        bench_serve_report.bench_launched(["cpp", "vpp"], spec, plan, 3, tmp_path, out, None, None, "table")
    assert json.loads(out.read_text())["verdicts"] == []
