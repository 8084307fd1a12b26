"""The simulator on batched forwards: short prompts share a forward up to the chunk size."""

import pytest

from sglang_vpp.schedule import ChunkSpec, StageSpec
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.workloads import mixed_workload, short_workload


@pytest.fixture(scope="module")
def deepseek():
    model = load_model("deepseek-v3.1")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


def _run(mode, workload, deepseek, batch, chunk=8192, num_ranks=2):
    model, cost = deepseek
    config = RunConfig(num_ranks, chunk, batch_requests=batch, sim=SimConfig(record_timeline=False))
    return run_mode(mode, workload, cost, config, model.num_layers, keep_schedule=True)


def test_one_batched_forward_is_cheaper_than_its_requests_apart(deepseek):
    _, cost = deepseek
    stage = StageSpec(0, 0, 0, 30)
    prompts = [ChunkSpec(i, 0, 0, 1024, True) for i in range(8)]
    batch = ChunkSpec(0, 0, 0, 1024, True, tuple(prompts[1:]))
    apart = [cost.stage_breakdown(stage, p) for p in prompts]
    together = cost.stage_breakdown(stage, batch)
    assert together.total_s < 0.7 * sum(t.total_s for t in apart)
    # one forward: the host overhead and the TP collectives' latency are paid once
    assert together.overhead_s == apart[0].overhead_s
    assert together.tp_comm_s < sum(t.tp_comm_s for t in apart)
    # attention is per request: 8 prompts of 1K attend far less than one 8K prompt
    assert together.compute_s < cost.stage_breakdown(stage, ChunkSpec(0, 0, 0, 8192, True)).compute_s


@pytest.mark.parametrize("mode", ["cpp", "vpp-pack"])
def test_short_prompts_batched_finish_sooner_and_all_complete(mode, deepseek):
    workload = short_workload(1024, 32)
    apart, together = _run(mode, workload, deepseek, False), _run(mode, workload, deepseek, True)
    for result in (apart, together):
        assert result.sim.ok and len(result.sim.request_ttft_s) == 32
        assert result.sim.num_tokens == 32 * 1024
    assert together.sim.num_chunks == 4 and apart.sim.num_chunks == 32
    assert together.sim.makespan_s < 0.8 * apart.sim.makespan_s


def test_closed_loop_batch_waits_for_every_request_release(deepseek):
    workload = short_workload(1024, 24, concurrency=6)
    result = _run("cpp", workload, deepseek, True)
    sim = result.sim
    assert sim.ok and len(sim.request_finish_s) == 24
    assert any(c.batch for c in result.schedule.chunks)
    for chunk in result.schedule.chunks:
        start = max(sim.request_release_s[p.request_index] for p in chunk.parts)
        for part in chunk.parts:
            assert sim.request_finish_s[part.request_index] > start
            assert sim.request_finish_s[part.request_index] == sim.request_finish_s[chunk.request_index]


def test_mixed_workload_batches_its_short_requests(deepseek):
    workload = mixed_workload(60)
    apart, together = _run("vpp-pack", workload, deepseek, False), _run("vpp-pack", workload, deepseek, True)
    assert together.sim.num_chunks < apart.sim.num_chunks
    assert together.sim.num_tokens == apart.sim.num_tokens
    assert together.sim.makespan_s < apart.sim.makespan_s
