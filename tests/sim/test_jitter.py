"""Stage-time jitter (``simulate --jitter``): an explicit what-if; off by default; the planner's
clock and the simulator see the same jittered durations while the controller keeps its estimate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.schedule import ChunkSpec, LinearAttentionCost, StageSpec
from sglang_vpp.sim.cost.jitter import JitteredCostModel
from sglang_vpp.sim.errors import SimError
from sglang_vpp.sim.runner import RunConfig, plan_workload, run_mode
from sglang_vpp.sim.workloads import long_workload

COST = LinearAttentionCost(fixed_per_chunk=1e-4, transfer_per_token=1e-9)
WORK = long_workload([64 * 1024])


def _run(mode: str, jitter: float, seed: int = 0):
    return run_mode(mode, WORK, COST, RunConfig(2, 4096, jitter=jitter, jitter_seed=seed), 16, keep_schedule=True)


def test_zero_jitter_is_the_cost_model_exactly() -> None:
    stage, chunk = StageSpec(0, 0, 0, 8), ChunkSpec(0, 3, 4096, 4096)
    assert JitteredCostModel(COST, 0.0).stage_cost(stage, chunk) == COST.stage_cost(stage, chunk)
    assert _run("vpp", 0.0).sim.to_dict() == run_mode("vpp", WORK, COST, RunConfig(2, 4096), 16).sim.to_dict()


def test_draws_are_per_seed_stage_and_chunk() -> None:
    stage, chunk = StageSpec(1, 0, 0, 8), ChunkSpec(0, 3, 4096, 4096)
    a, b = JitteredCostModel(COST, 0.03, seed=1), JitteredCostModel(COST, 0.03, seed=2)
    assert a.stage_cost(stage, chunk) == JitteredCostModel(COST, 0.03, seed=1).stage_cost(stage, chunk)
    assert a.stage_cost(stage, chunk) != b.stage_cost(stage, chunk)
    factors = [a.factor(StageSpec(s, 0, 0, 8), ChunkSpec(0, c, 0, 1)) for s in range(4) for c in range(200)]
    spread = (sum((f - 1) ** 2 for f in factors) / len(factors)) ** 0.5
    assert 0.02 < spread < 0.04
    with pytest.raises(SimError, match="--jitter"):
        JitteredCostModel(COST, 1.5)


def test_per_rank_draws_are_shared_by_a_chunks_stages_on_one_rank() -> None:
    chunk = ChunkSpec(0, 3, 4096, 4096)
    v_at_two = [StageSpec(s, r, 2 * s, 2 * s + 2) for s, r in enumerate((0, 1, 1, 0))]
    per_rank = JitteredCostModel(COST, 0.05, seed=1, per_rank=True)
    factors = [per_rank.factor(stage, chunk) for stage in v_at_two]
    assert factors[0] == factors[3] and factors[1] == factors[2] and factors[0] != factors[1]
    per_stage = JitteredCostModel(COST, 0.05, seed=1)
    assert len({per_stage.factor(stage, chunk) for stage in v_at_two}) == 4
    # A contiguous layout (stage i on rank i) draws the same either way.
    contiguous = [StageSpec(s, s, 4 * s, 4 * s + 4) for s in range(2)]
    assert [per_rank.factor(s, chunk) for s in contiguous] == [per_stage.factor(s, chunk) for s in contiguous]
    # Another chunk of the same rank draws anew.
    assert per_rank.factor(v_at_two[0], ChunkSpec(0, 4, 8192, 4096)) != factors[0]


@pytest.mark.parametrize("fold, pairs", [("split", ((0, 3), (1, 2))), ("fused", ((0, 2),))])
def test_a_run_jittered_per_rank_shares_each_ranks_factor_across_its_stages(fold: str, pairs) -> None:
    config = RunConfig(2, 4096, jitter=0.05, jitter_seed=3, jitter_by="rank", fold=fold)
    result = run_mode("vpp", WORK, COST, config, 16, keep_schedule=True)
    exact = run_mode("vpp", WORK, COST, RunConfig(2, 4096, fold=fold), 16)
    time = {(s.stage_index, s.chunk_index): s.end - s.start for s in result.sim.timeline if s.kind == "compute"}
    base = {(s.stage_index, s.chunk_index): s.end - s.start for s in exact.sim.timeline if s.kind == "compute"}
    for chunk in {c for _, c in time}:
        for first, second in pairs:
            assert time[first, chunk] / base[first, chunk] == pytest.approx(time[second, chunk] / base[second, chunk])
        assert time[0, chunk] / base[0, chunk] != pytest.approx(time[1, chunk] / base[1, chunk])
    per_stage = run_mode("vpp", WORK, COST, RunConfig(2, 4096, jitter=0.05, jitter_seed=3, fold=fold), 16)
    assert result.sim.makespan_s != per_stage.sim.makespan_s
    with pytest.raises(SimError, match="jitter_by must be one of stage, rank"):
        RunConfig(2, 4096, jitter_by="device")


@pytest.mark.parametrize("mode", ["cpp", "dcpp", "vpp", "vpp-pack"])
def test_the_dry_run_and_the_simulator_use_the_same_jittered_durations(mode: str) -> None:
    result = _run(mode, 0.05, seed=3)
    dry_run = plan_workload(mode, WORK, COST, RunConfig(2, 4096, jitter=0.05, jitter_seed=3), 16).schedule
    planned = {(e.rank, e.stage_index, e.request_index, e.chunk_index): e.end - e.start
               for e in dry_run.timeline}
    simulated = {(s.rank, s.stage_index, s.request_index, s.chunk_index): s.end - s.start
                 for s in result.sim.timeline if s.kind == "compute"}
    assert planned.keys() == simulated.keys()
    assert all(planned[k] == pytest.approx(simulated[k], rel=1e-9) for k in planned)
    exact = _run(mode, 0.0)
    assert result.sim.makespan_s != exact.sim.makespan_s
    # The controller's chunks come from its estimate, never from the jittered durations.
    assert [c.key for c in result.schedule.chunks] == [c.key for c in exact.schedule.chunks]


def test_simulate_json_reports_jitter_and_idle_by_cause(tmp_path) -> None:
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["simulate", "--pp", "2", "--seq-len", "128k", "--chunk-size", "24k",
                                      "--modes", "cpp,dcpp,vpp", "--jitter", "0.03", "--jitter-seed", "4",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["config"]["jitter"] == 0.03 and data["config"]["jitter_seed"] == 4
    for row in data["results"]:
        causes = row["idle_by_cause_s"]
        assert sum(causes.values()) == pytest.approx(row["bubble_s"], rel=1e-6, abs=1e-9)
    bad = CliRunner().invoke(app, ["simulate", "--seq-len", "64k", "--jitter", "-0.1"])
    assert bad.exit_code == 2 and "--jitter" in bad.output
