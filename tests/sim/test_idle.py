"""Idle by cause: every bubble second has a mechanism, and a mode pays only for the ones it has."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.hardware_spec import HardwareSpec
from sglang_vpp.sim.idle import IDLE_CAUSES
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.errors import PresetError
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.workloads import long_workload, short_workload

MODES = ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-taper")


@pytest.fixture(scope="module")
def deepseek():
    model = load_model("deepseek-v3.1")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


@pytest.fixture(scope="module")
def runs(deepseek):
    model, cost = deepseek
    config = RunConfig(2, 8192, sim=SimConfig(record_timeline=False))
    return {mode: run_mode(mode, long_workload([65536]), cost, config, model.num_layers).sim for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_causes_add_up_to_each_ranks_bubble(runs, mode):
    for rank in runs[mode].per_rank:
        assert set(rank.idle_by_cause) == set(IDLE_CAUSES)
        assert sum(rank.idle_by_cause.values()) == pytest.approx(rank.bubble_s, rel=1e-9, abs=1e-12)
        assert all(v >= -1e-9 for v in rank.idle_by_cause.values()), rank.idle_by_cause
        assert abs(rank.idle_by_cause["other"]) < 1e-9 * max(1.0, rank.bubble_s)


def test_only_the_blocking_mode_pays_for_rendezvous(runs):
    vpp = runs["vpp"]
    assert vpp.idle_by_cause["rendezvous"] > 0.02 * vpp.bubble_s
    for mode in ("cpp", "dcpp", "vpp-async", "vpp-pack", "vpp-taper"):
        assert runs[mode].idle_by_cause["rendezvous"] == 0.0, mode


def test_scheduling_gap_is_one_iteration_per_micro_batch_and_rank_plus_the_revisit(runs, deepseek):
    hardware = deepseek[1].hardware
    iteration, revisit = hardware.chunk_overhead_s, hardware.revisit_overhead_s
    assert 0 < revisit < iteration
    for mode, sim in runs.items():
        # A fold-back rank runs its two stages of every chunk (half its computes revisit it).
        per_chunk = iteration + revisit if mode.startswith("vpp") else iteration
        forwards = 2 if mode.startswith("vpp") else 1
        for rank in sim.per_rank:
            assert rank.idle_by_cause["scheduling_gap"] == pytest.approx(
                per_chunk * rank.num_computes / forwards), mode
    # Same chunks: a fold-back rank runs two stages (two forwards) per chunk, a contiguous one one.
    assert runs["vpp-pack"].per_rank[0].num_computes == 2 * runs["cpp"].per_rank[0].num_computes


def test_fill_on_later_ranks_drain_and_admission_where_they_arise(runs):
    cpp = runs["cpp"].per_rank
    assert cpp[0].idle_by_cause["fill"] == 0.0 and cpp[1].idle_by_cause["fill"] > 0
    assert cpp[0].idle_by_cause["drain"] > 0  # rank 0 waits while rank 1 finishes the last chunk
    model = load_model("qwen3-tiny")
    cost = AnalyticCostModel(model, load_hardware("cpu"))
    short = run_mode("cpp", short_workload(512, 8, None), cost, RunConfig(2, 512, sim=SimConfig(record_timeline=False)),
                     model.num_layers).sim
    assert short.per_rank[0].idle_by_cause["admission"] > 0  # micro-batch slots come back late


def test_no_fitted_idle_fraction_remains():
    assert "sync_idle_fraction" not in HardwareSpec.__dataclass_fields__
    for name in ("ascend-910c", "h200", "cpu"):
        assert not hasattr(load_hardware(name), "sync_idle_fraction")


def test_a_preset_with_an_idle_fraction_is_refused(tmp_path):
    path = tmp_path / "old.json"
    data = {"name": "old", "tp_size": 8, "peak_flops": 1e15, "hbm_bytes_per_s": 1e12, "tp_bytes_per_s": 1e11,
                 "tp_latency_s": 1e-5, "pp_bytes_per_s": 1e11, "pp_latency_s": 1e-5, "sync_idle_fraction": 0.03}
    path.write_text(json.dumps(data))
    with pytest.raises(PresetError, match="sync_idle_fraction"):
        load_hardware(str(path))


def test_simulate_json_and_table_carry_idle_by_cause(tmp_path):
    out = tmp_path / "idle.json"
    result = CliRunner().invoke(app, ["simulate", "--seq-len", "64k", "--chunk-size", "8k", "--modes", "cpp,vpp,vpp-pack", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "idle by cause" in result.output and "rendezvous" in result.output
    rows = json.loads(out.read_text())["results"]
    for row in rows:
        assert set(row["idle_by_cause_s"]) == set(IDLE_CAUSES)
        assert sum(row["idle_by_cause_s"].values()) == pytest.approx(row["bubble_s"], rel=1e-9)
        assert all("idle_by_cause_s" in rank for rank in row["per_rank"])


@pytest.mark.parametrize("mode", ["cpp", "vpp-pack"])
def test_waiting_for_the_first_arrival_is_no_bubble(tmp_path, mode):
    """A workload file whose one request arrives at 5 s accounts the same idle, bubble ratio and
    throughput as the same request at 0 (it showed 88.7 % bubble): only the clock is offset."""
    from sglang_vpp.schedule import LinearAttentionCost
    from sglang_vpp.sim.workloads import file_workload

    cost = LinearAttentionCost(transfer_per_token=1e-7)
    sims = {}
    for arrival in (0.0, 5.0):
        path = tmp_path / f"at{arrival}.jsonl"
        path.write_text(json.dumps({"length": 8192, "arrival": arrival}) + "\n")
        sims[arrival] = run_mode(mode, file_workload(path), cost, RunConfig(2, 1024), 8).sim
    at0, late = sims[0.0], sims[5.0]
    assert late.start_s == 5.0 and at0.start_s == 0.0
    assert late.makespan_s == pytest.approx(at0.makespan_s + 5.0)
    assert late.bubble_ratio == pytest.approx(at0.bubble_ratio) and late.bubble_ratio < 0.5
    assert late.throughput_tok_s == pytest.approx(at0.throughput_tok_s)
    for a, b in zip(at0.per_rank, late.per_rank):
        assert b.bubble_s == pytest.approx(a.bubble_s)
        assert b.compute_s + b.exposed_comm_s + b.bubble_s == pytest.approx(late.makespan_s - late.start_s)
        assert b.idle_by_cause == pytest.approx(a.idle_by_cause)


def test_other_is_zero_when_the_causes_miss_only_float_rounding():
    """100000 one-token requests summed the causes to 589.788 s in another order than the bubble:
    other was -4.9e-9 s, a column that printed -0.000. A real rest still shows."""
    from sglang_vpp.sim.idle import IdleCause, IdleLedger

    ledger = IdleLedger(1)
    ledger.stopped(0, IdleCause.UPSTREAM_WAIT)
    ledger.compute(0, 0.0, 1.0, 0.0)  # starts the rank: later waits upstream are not fill
    ledger.stopped(0, IdleCause.UPSTREAM_WAIT)
    ledger.compute(0, 590.0, 591.0, 0.0)
    assert ledger.finish(0, 591.0, 589.0 - 4.9e-9)["other"] == 0.0
    assert ledger.finish(0, 591.0, 590.0)["other"] == pytest.approx(1.0)
