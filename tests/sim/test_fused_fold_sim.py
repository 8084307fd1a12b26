"""The simulator runs a fused-fold layout unchanged: the fold rank runs one forward per
micro-batch, so its scheduling gap loses the host time of the second forward (the revisit) and
every other rank's stays."""

import pytest

from sglang_vpp.schedule import ActionKind, Fold
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.sweep import simulate_matrix
from sglang_vpp.sim.workloads import build_workload


@pytest.fixture(scope="module")
def qwen():
    model = load_model("qwen3-coder-30b-a3b")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


@pytest.mark.parametrize("mode", ["vpp-pack", "vpp-stream"])
def test_fold_rank_runs_one_forward_per_micro_batch(qwen, mode):
    model, cost = qwen
    work = build_workload("short", lengths=[4096], num_requests=8)
    num_ranks = 4
    results = {fold: run_mode(mode, work, cost, RunConfig(num_ranks, 16384, fold=fold), model.num_layers,
                              keep_schedule=True) for fold in Fold}
    split, fused = results[Fold.SPLIT], results[Fold.FUSED]
    assert fused.sim.ok and fused.schedule.layout.fold is Fold.FUSED
    micro_batches = len(fused.schedule.chunks)
    computes = [sum(a.kind is ActionKind.COMPUTE for a in actions) for actions in fused.schedule.rank_actions]
    assert computes == [2 * micro_batches] * (num_ranks - 1) + [micro_batches]
    gap = [[r.idle_by_cause.get("scheduling_gap", 0.0) for r in res.sim.per_rank] for res in (split, fused)]
    revisit = cost.hardware.revisit_overhead_s
    assert revisit > 0
    assert gap[1][num_ranks - 1] == pytest.approx(gap[0][num_ranks - 1] - micro_batches * revisit)
    assert gap[1][:num_ranks - 1] == pytest.approx(gap[0][:num_ranks - 1])
    # One revisit fewer on every micro-batch's trip: no request waits longer.
    assert fused.sim.ttft_s < split.sim.ttft_s


def test_sweep_passes_the_fold_to_vpp_modes_only(qwen):
    model, cost = qwen
    work = build_workload("long", lengths=[65536])
    rows = {(r.result.mode, f): r for f in ("split", "fused")
            for r in simulate_matrix(work, cost, model.num_layers, "cpp,vpp", [16384], 2, keep_schedules=True, fold=f)}
    assert rows[("cpp", "fused")].result.schedule.layout == rows[("cpp", "split")].result.schedule.layout
    assert rows[("vpp", "fused")].result.schedule.layout.num_stages == 3
    assert rows[("vpp", "split")].result.schedule.layout.num_stages == 4


def test_decode_estimate_on_a_fused_fold(qwen):
    from sglang_vpp.sim.decode import estimate_decode

    model, cost = qwen
    split = estimate_decode("vpp-pack", 4, model.num_layers, cost, 32, 4096)
    fused = estimate_decode("vpp-pack", 4, model.num_layers, cost, 32, 4096, fold="fused")
    assert fused.slots == split.slots  # the decode slots are the method's (stock PP's P)
    assert fused.forwards_per_round == split.forwards_per_round  # ranks 0..P-2 still run two
    assert fused.trip_s < split.trip_s  # one forward, one host gap, fewer per trip
