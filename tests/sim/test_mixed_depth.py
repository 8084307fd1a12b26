"""The mixed-traffic claim of docs/simulator.md: DeepSeek-V3.1 on Ascend 910C, 60 mixed-length
requests at concurrency 16.

- vpp-stream at or below the best of CPP and DCPP at P = 2, 4, 8 in TTFT and throughput, each mode
  at its best chunk size of 8K-32K;
- every fold-back mode's plan of the mixed load is valid and passes the deadlock checker;
- on one long prompt at a time vpp-stream plans as vpp-pack (its rules only act between requests);
- with partial fill the request barrier holds almost nothing back: vpp-pack leads cpp and dcpp
  at P = 4 and 8, where with whole requests it is far behind them.
"""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import FOLDBACK_MODES, check_deadlock, find_issues
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, plan_workload
from sglang_vpp.sim.sweep import simulate_matrix
from sglang_vpp.sim.workloads import build_workload, long_workload

CHUNKS = [8192, 16384, 24576, 32768]
QUIET = SimConfig(record_timeline=False)


@pytest.fixture(scope="module")
def deepseek():
    model = load_model("deepseek-v3.1")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


@pytest.fixture(scope="module")
def mixed():
    return build_workload("mixed", num_requests=60, concurrency=16, seed=0)


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_vpp_stream_at_or_below_cpp_and_dcpp_on_mixed_traffic(deepseek, mixed, num_ranks):
    model, cost = deepseek
    rows = simulate_matrix(mixed, cost, model.num_layers, "cpp,dcpp,vpp-stream", CHUNKS, num_ranks, sim=QUIET)
    ttft: dict[str, float] = {}
    throughput: dict[str, float] = {}
    for row in rows:
        mode, sim = row.result.mode, row.result.sim
        assert sim.ok, (mode, row.result.chunk_size)
        ttft[mode] = min(ttft.get(mode, float("inf")), sim.ttft_s)
        throughput[mode] = max(throughput.get(mode, 0.0), sim.throughput_tok_s)
    assert ttft["vpp-stream"] <= min(ttft["cpp"], ttft["dcpp"]), (num_ranks, ttft)
    assert throughput["vpp-stream"] >= max(throughput["cpp"], throughput["dcpp"]), (num_ranks, throughput)


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
@pytest.mark.parametrize("mode", [str(m) for m in FOLDBACK_MODES])
def test_mixed_plans_are_valid_and_deadlock_free(deepseek, mode, num_ranks):
    model, cost = deepseek
    work = build_workload("mixed", num_requests=24, concurrency=8, seed=1)
    plan = plan_workload(mode, work, cost, RunConfig(num_ranks, 16384), model.num_layers).schedule
    assert not find_issues(plan), (mode, num_ranks, find_issues(plan)[:3])
    report = check_deadlock(plan)
    assert not report.deadlock, report.describe(plan.rank_actions)


@pytest.mark.parametrize("num_ranks", [2, 8])
def test_vpp_stream_plans_one_long_prompt_as_vpp_pack(deepseek, num_ranks):
    model, cost = deepseek
    rows = simulate_matrix(long_workload([128 * 1024]), cost, model.num_layers, "vpp-pack,vpp-stream", [24576],
                           num_ranks, sim=QUIET)
    pack, stream = (row.result.sim for row in rows)
    assert stream.makespan_s == pytest.approx(pack.makespan_s, rel=1e-9)
    assert stream.ttft_s == pytest.approx(pack.ttft_s, rel=1e-9)


@pytest.mark.parametrize("num_ranks", [4, 8])
def test_with_partial_fill_the_barrier_holds_almost_nothing_back_and_vpp_pack_leads(deepseek, num_ranks):
    """docs/simulator.md's ``mixed-depth-fill`` block: a filled forward holds one request's end and
    the next one's head, so the request barrier keeps both in one group. vpp-pack then runs as
    vpp-stream held to its 2P-1 window and is ahead of cpp and dcpp; batching whole requests, the
    barrier leaves it behind them. The published rows are these runs (seed 0)."""
    from benchmark_scripts import load_benchmark

    bench = load_benchmark("mixed_depth")
    model, cost = deepseek
    filled = bench.best_runs(model, cost, num_ranks, 0, ablation=True, partial_fill=True)
    whole = bench.best_runs(model, cost, num_ranks, 0, partial_fill=False)
    pack, window = filled["vpp-pack"]["ttft"], filled[bench.ABLATION]["ttft"]
    assert pack.sim.ttft_s == window.sim.ttft_s and pack.sim.makespan_s == window.sim.makespan_s
    ttft_change, throughput_change = bench._versus_rivals(filled, "vpp-pack")
    assert ttft_change < 0 < throughput_change
    assert bench._versus_rivals(whole, "vpp-pack")[0] > 10  # the barrier: far behind
    block = bench.DOC.read_text().split("<!-- BEGIN sim_docs:mixed-depth-fill -->")[1].split("<!-- END")[0]
    assert (f"| {num_ranks} | vpp-pack | {pack.sim.ttft_s:.1f} ({bench.size_label(pack.chunk_size)}) |"
            in block), "run: python benchmarks/mixed_depth.py --write"
