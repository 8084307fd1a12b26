"""Cost models: analytic shape laws, the fitted model recovering known coefficients, table replay."""

from __future__ import annotations

import json
import random

import pytest

from sglang_vpp.schedule import ChunkSpec, LinearAttentionCost, build_layout, build_schedule, causal_pairs
from sglang_vpp.sim import CostModelError, SliceKind, simulate_schedule
from sglang_vpp.sim.cost.analytic import AnalyticCostModel, sparse_pairs
from sglang_vpp.sim.cost_model import (CostSample, FittedCostModel, TableCostModel, fit_cost_model, read_samples,
                                      write_samples)
from sglang_vpp.sim.preset_loader import load_hardware, load_model


def _stage(layers=61, num_ranks=2, kind="contiguous", index=0):
    return build_layout(num_ranks, layers, kind).stages[index]


def _chunk(tokens, prefix, index=0):
    return ChunkSpec(0, index, prefix, tokens)


def test_pairs_formulas_against_brute_force():
    for tokens, prefix, top_k in [(10, 0, 4), (10, 2, 4), (3, 1, 10), (7, 20, 8), (16, 5, 12)]:
        brute = sum(min(p + 1, top_k) for p in range(prefix, prefix + tokens))
        assert sparse_pairs(tokens, prefix, top_k) == brute
        assert causal_pairs(tokens, prefix) == sum(p + 1 for p in range(prefix, prefix + tokens))


def test_dense_attention_grows_linearly_with_prefix():
    cost = AnalyticCostModel(load_model("deepseek-v3.1"), load_hardware("ascend-910c"))
    stage = _stage()
    c = 24576
    taus = [cost.stage_cost(stage, _chunk(c, k * c)) for k in range(6)]
    steps = [b - a for a, b in zip(taus, taus[1:])]
    assert all(s > 0 for s in steps)
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)  # tau_k = a + b k
    assert taus[5] > 3 * taus[0]  # the attention slope dominates the growth


def test_dsa_attention_stops_growing_but_indexer_does_not():
    model, hw = load_model("glm-5.2"), load_hardware("ascend-910c")
    cost = AnalyticCostModel(model, hw)
    stage = _stage(layers=model.num_layers)
    c = 16384
    taus = [cost.stage_cost(stage, _chunk(c, k * c)) for k in range(1, 8)]
    steps = [b - a for a, b in zip(taus, taus[1:])]
    dense = AnalyticCostModel(load_model("deepseek-v3.1"), hw)
    dense_steps = [dense.stage_cost(_stage(), _chunk(c, (k + 1) * c)) - dense.stage_cost(_stage(), _chunk(c, k * c))
                   for k in range(1, 7)]
    assert all(s > 0 for s in steps)  # the indexer still scans the prefix
    assert steps[-1] < 0.5 * dense_steps[-1] * model.num_layers / 61  # much flatter than dense attention


def test_small_chunks_cost_more_per_token_and_more_collectives():
    cost = AnalyticCostModel(load_model("deepseek-v3.1"), load_hardware("ascend-910c"))
    stage = _stage()
    big = cost.stage_breakdown(stage, _chunk(24576, 0))
    small = [cost.stage_breakdown(stage, _chunk(6144, i * 6144)) for i in range(4)]
    # Same tokens, fragmented: more math (efficiency), more TP latency (4x the collectives).
    linear_big = cost.stage_breakdown(stage, _chunk(24576, 10**6)).compute_s  # prefix kept large for both
    assert sum(s.tp_comm_s for s in small) > big.tp_comm_s
    per_token_small = cost.stage_breakdown(stage, _chunk(1024, 0)).compute_s / 1024
    per_token_big = big.compute_s / 24576
    assert per_token_small > per_token_big * 0.3 and linear_big > 0
    assert cost.stage_cost(stage, _chunk(512, 0)) / 512 > cost.stage_cost(stage, _chunk(8192, 0)) / 8192


def test_transfer_cost_is_bytes_over_bandwidth_plus_latency():
    hw = load_hardware("ascend-910c")
    cost = AnalyticCostModel(load_model("deepseek-v3.1"), hw)
    hop = cost.transfer_cost(_stage(), _chunk(24576, 0))
    assert hop == pytest.approx(hw.pp_latency_s + 24576 * 7168 * 2 / hw.pp_bytes_per_s)
    assert 24576 * 7168 * 2 == pytest.approx(350e6, rel=0.01)  # the method doc's ~350 MB


def _synthetic_samples(a=2e-11, b=3e-6, d=0.02, noise=0.0, layers=12, stages=(0, 1), seed=0):
    rng = random.Random(seed)
    samples = []
    for request, tokens in enumerate((1024, 4096, 8192)):
        for k in range(6):
            prefix = k * tokens
            for stage in stages:
                exact = a * tokens * (tokens + prefix) + b * (tokens + prefix) + d
                samples.append(CostSample("compute", stage, request, k, prefix, tokens,
                                          exact * (1 + rng.uniform(-noise, noise)), layers))
                samples.append(CostSample("transfer", stage, request, k, prefix, tokens, 1e-4 + 2e-8 * tokens))
    return samples


def test_fitted_model_recovers_coefficients():
    fitted = fit_cost_model(_synthetic_samples())
    coeff = fitted.stages[0]
    assert (coeff.a, coeff.b, coeff.d) == pytest.approx((2e-11, 3e-6, 0.02), rel=1e-6)
    assert coeff.rel_rmse < 1e-9
    assert fitted.transfer.alpha == pytest.approx(1e-4, rel=1e-6)
    assert fitted.transfer.beta == pytest.approx(2e-8, rel=1e-6)
    # The per-layer fit answers for a layout with other layer counts.
    per_layer = fitted.stage_cost(build_layout(4, 24, "foldback").stages[5], _chunk(4096, 8192))
    assert per_layer == pytest.approx((2e-11 * 4096 * 12288 + 3e-6 * 12288 + 0.02) / 12 * 3, rel=1e-6)  # 3 layers


def test_fitted_model_with_noise_and_json_round_trip(tmp_path):
    fitted = fit_cost_model(_synthetic_samples(noise=0.02), meta={"run": "synthetic"})
    assert fitted.stages[0].rel_rmse < 0.03
    again = FittedCostModel.from_json(json.loads(json.dumps(fitted.to_json())))
    assert again == fitted
    fitted.save(tmp_path / "fit.json")
    assert FittedCostModel.load(tmp_path / "fit.json") == fitted


def test_fitted_model_errors():
    with pytest.raises(CostModelError, match="fewer than 3 compute samples"):
        fit_cost_model(_synthetic_samples()[:4])
    fitted = fit_cost_model([s for s in _synthetic_samples() if True], meta={})
    only_stage0 = FittedCostModel({0: fitted.stages[0]})
    with pytest.raises(CostModelError, match="no fitted cost for stage 1"):
        only_stage0.stage_cost(build_layout(2, 24, "contiguous").stages[1], _chunk(10, 0))
    with pytest.raises(CostModelError, match="format"):
        FittedCostModel.from_json({"format": "nope"})


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_samples_round_trip(tmp_path, suffix):
    samples = _synthetic_samples()
    path = tmp_path / f"samples{suffix}"
    write_samples(samples, path, meta={"model": "tiny"})
    assert read_samples(path) == samples


def _batched_forward(lead: tuple[int, int], others: tuple[tuple[int, int], ...]) -> ChunkSpec:
    """A forward of whole prompts (prefix 0), the lead (prefix, tokens) first."""
    batch = tuple(ChunkSpec(1 + i, 0, prefix, tokens, True) for i, (prefix, tokens) in enumerate(others))
    return ChunkSpec(0, 0, lead[0], lead[1], batch=batch)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_batched_samples_round_trip(tmp_path, suffix):
    samples = [CostSample("compute", 0, 0, 0, 0, 256, 0.05, 4, 0, ((0, 256), (0, 100))),
               CostSample("compute", 1, 0, 0, 0, 256, 0.04, 4, 1)]
    path = tmp_path / f"samples{suffix}"
    write_samples(samples, path)
    assert read_samples(path) == samples
    assert samples[0].parts == ((0, 256), (0, 256), (0, 100))


def test_a_batched_forward_is_fitted_with_the_features_it_is_predicted_with():
    # Every forward has one shape (four whole 256-token prompts), so the fit cannot separate the
    # per-forward constant from the token terms; fitted on the features the prediction uses, it
    # still reproduces such a forward.
    stage = _stage(layers=8, num_ranks=2, index=0)  # 4 layers, as measured
    a, b, d = 2e-9, 3e-6, 0.02
    per_part = a * 256 * 256 + b * 256
    measured = d + 4 * per_part
    samples = [CostSample("compute", 0, 0, k, 0, 256, measured * (1 + 0.001 * (k % 3 - 1)), 4, 0,
                          ((0, 256),) * 3) for k in range(12)]
    fitted = fit_cost_model(samples)
    forward = _batched_forward((0, 256), ((0, 256),) * 3)
    assert fitted.stage_cost(stage, forward) == pytest.approx(measured, rel=0.01)
    # Forwards of several shapes identify the coefficients themselves.
    shapes = [((0, c),) * n for c in (64, 256, 1024) for n in (1, 2, 4)]
    samples = [CostSample("compute", 0, 0, k, 0, parts[0][1], d + sum(a * c * c + b * c for _, c in parts), 4, 0,
                          parts[1:]) for k, parts in enumerate(shapes)]
    coeff = fit_cost_model(samples).stages[0]
    assert (coeff.a, coeff.b, coeff.d) == pytest.approx((a, b, d), rel=1e-6)


def test_samples_reject_bad_input(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("kind,stage,request,chunk,prefix,tokens,duration_s\ncompute,0,0,0,0,,1.0\n")
    with pytest.raises(CostModelError, match="missing fields"):
        read_samples(bad)
    with pytest.raises(CostModelError, match="kind"):
        CostSample("backward", 0, 0, 0, 0, 1, 1.0)
    with pytest.raises(CostModelError, match="batched part"):
        CostSample("compute", 0, 0, 0, 0, 1, 1.0, batch=((0, 0),))
    # a fit of zero-layer stages would be written, and refused only when the fitted file is read
    with pytest.raises(CostModelError, match="a stage runs at least 1 layer"):
        CostSample("compute", 0, 0, 0, 0, 1, 1.0, num_layers=0)
    bad.write_text("kind,stage,request,chunk,prefix,tokens,duration_s,batch\ncompute,0,0,0,0,5,1.0,12\n")
    with pytest.raises(CostModelError, match="prefix:tokens"):
        read_samples(bad)


def test_table_model_replays_a_run_exactly():
    """Record a run's per-action costs, replay them through the table model: identical run."""
    cost = LinearAttentionCost(transfer_per_token=1e-7)
    schedule = build_schedule("vpp-async", 2, 8, [8192, 4096], 1024, cost=cost)
    original = simulate_schedule(schedule, cost)
    samples = [CostSample("compute", s.stage_index, s.request_index, s.chunk_index, s.args["prefix"],
                          s.args["tokens"], s.duration) for s in original.timeline if s.kind is SliceKind.COMPUTE]
    samples += [CostSample("transfer", s.stage_index, s.request_index, s.chunk_index, 0, 1, s.duration)
                for s in original.timeline if s.kind is SliceKind.SEND]
    table = TableCostModel.fit(samples)
    replay = simulate_schedule(schedule, table)
    assert replay.makespan_s == pytest.approx(original.makespan_s, rel=1e-12)
    assert TableCostModel.from_json(table.to_json()).compute == table.compute
    with pytest.raises(CostModelError, match="no measured compute"):
        table.stage_cost(build_layout(2, 8, "foldback").stages[0], ChunkSpec(9, 0, 0, 10))
    with_fallback = TableCostModel.fit(samples, fallback=cost)
    assert with_fallback.stage_cost(build_layout(2, 8, "foldback").stages[0], ChunkSpec(9, 0, 0, 10)) > 0


def test_a_stages_second_visit_of_a_rank_pays_the_revisit_not_an_iteration():
    model, hw = load_model("deepseek-v3.1"), load_hardware("ascend-910c")
    cost = AnalyticCostModel(model, hw)
    layout = build_layout(2, model.num_layers, "vpp", [16, 15, 15, 15])
    chunk = ChunkSpec(0, 0, 0, 8192)
    first, second = layout.stages[1], layout.stages[2]  # rank 1's way up and way back
    assert (first.visit, second.visit) == (0, 1)
    assert cost.stage_breakdown(first, chunk).overhead_s == hw.chunk_overhead_s
    assert cost.stage_breakdown(second, chunk).overhead_s == hw.revisit_overhead_s < hw.chunk_overhead_s
    # Equal layers, so the device time is the same: only the host time differs.
    assert cost.stage_breakdown(first, chunk).compute_s == pytest.approx(cost.stage_breakdown(second, chunk).compute_s)
