"""Cost facts written once and read by every caller: the causal pair count (schedule core,
analytic model), the fitted profile's features (the fit and the prediction), and the transfer
line (the fitted profile and the equal-cost replay). Each is checked by hand here."""

from __future__ import annotations

import json

import pytest

from sglang_vpp.runtime.equal_cost import MeasuredRunCosts, SharedCostModel
from sglang_vpp.schedule import ChunkSpec, RequestSpec, build_layout, build_schedule, cost
from sglang_vpp.schedule.cpu_cost import CONTEXT_PER_LAYER_S, PAIR_PER_LAYER_S, STAGE_CALL_S
from sglang_vpp.schedule.fitted_cost import Coefficients, FittedCostModel, TransferFit, fit_features
from sglang_vpp.sim.cost import analytic
from sglang_vpp.sim.cost.fitted import fit_coefficients, fit_cost_model, fit_transfer_line
from sglang_vpp.sim.cost.samples import CostSample

from benchmark_scripts import load_benchmark


def test_the_analytic_model_counts_pairs_with_the_schedule_cores_function():
    assert analytic.causal_pairs is cost.causal_pairs
    assert analytic.attention_work is cost.attention_work
    # DSA: queries before position top_k see every earlier key, the rest top_k keys.
    assert analytic.sparse_pairs(4, 0, 2) == 1 + 2 + 2 + 2
    assert analytic.sparse_pairs(3, 1, 3) == 2 + 3 + 3


@pytest.mark.parametrize(("parts", "features"), [
    (((0, 4),), (16.0, 4.0, 1.0)),                 # c (c + L) = 4 * 4, c + L = 4
    (((10, 2), (0, 3)), (33.0, 15.0, 1.0)),        # 2 * 12 + 3 * 3, 12 + 3; one forward, one d
    (((100, 1),), (101.0, 101.0, 1.0)),
])
def test_fit_features_by_hand_and_the_prediction_reads_them(parts, features):
    assert fit_features(parts) == features
    coefficients = Coefficients(2e-9, 3e-6, 1e-3)
    expected = sum(c * f for c, f in zip((2e-9, 3e-6, 1e-3), features))
    assert coefficients.forward(parts) == pytest.approx(expected, rel=1e-12)
    # The stage cost of the same forward as a ChunkSpec.
    (prefix, tokens), *others = parts
    chunk = ChunkSpec(0, 0, prefix, tokens, batch=tuple(ChunkSpec(1 + i, 0, p, c, True) for i, (p, c) in enumerate(others)))
    stage = build_layout(2, 2, "contiguous").stages[0]
    assert FittedCostModel({0: coefficients}).stage_cost(stage, chunk) == coefficients.forward(parts)


def test_the_fit_solves_on_the_prediction_features():
    truth = Coefficients(2e-9, 3e-6, 1e-3)
    forwards = [((0, 512),), ((512, 512),), ((1024, 256), (0, 64)), ((0, 128), (0, 128), (0, 64)), ((4096, 1024),)]
    samples = [CostSample("compute", 0, i, 0, *parts[0], truth.forward(parts), 1, batch=parts[1:])
               for i, parts in enumerate(forwards)]
    fitted = fit_coefficients(samples)
    assert (fitted.a, fitted.b, fitted.d) == pytest.approx((truth.a, truth.b, truth.d), rel=1e-6)


def test_transfer_line_by_hand():
    for tokens, seconds in (([100, 200, 300], [1.1e-3, 1.2e-3, 1.3e-3]), ([100, 200], [1.1e-3, 1.2e-3])):
        line = fit_transfer_line(tokens, seconds)
        assert (line.alpha, line.beta, line.num_samples) == pytest.approx((1e-3, 1e-6, len(tokens)), rel=1e-9)
        assert line(1000) == pytest.approx(2e-3, rel=1e-9)
    line = fit_transfer_line([128, 128], [2e-4, 4e-4])  # one size: no intercept, the mean per token
    assert (line.alpha, line.beta, line.num_samples) == pytest.approx((0.0, 3e-4 / 128, 2), rel=1e-12)
    assert fit_transfer_line([], []) == TransferFit(0.0, 0.0, 0)
    assert fit_transfer_line([100, 200], [2e-3, 1e-3]).beta == 0.0  # kept >= 0


def test_the_profile_and_the_equal_cost_replay_fit_one_transfer_line():
    plan = build_schedule("cpp", 2, 4, [RequestSpec(600)], 256)  # chunks of 256, 256 and 88 tokens
    samples = []
    for stage in plan.layout.stages:
        for chunk in plan.chunks:
            samples.append(CostSample("compute", stage.stage_index, chunk.request_index, chunk.chunk_index,
                                      chunk.start, chunk.num_tokens, 1e-3 + 1e-6 * chunk.num_tokens, stage.num_layers))
            samples.append(CostSample("transfer", stage.stage_index, chunk.request_index, chunk.chunk_index,
                                      chunk.start, chunk.num_tokens, 5e-5 + 2e-8 * chunk.num_tokens))
    profile = fit_cost_model(samples).transfer
    shared = SharedCostModel.fit([MeasuredRunCosts("cpp", plan.layout, samples)])
    assert (profile.alpha, profile.beta) == pytest.approx((5e-5, 2e-8), rel=1e-6)
    assert (shared.transfer_line.alpha, shared.transfer_line.beta) == pytest.approx((profile.alpha, profile.beta), rel=1e-9)
    assert shared.transfer(1000) == pytest.approx(5e-5 + 2e-8 * 1000, rel=1e-6)  # a size no mode sent: the line
    assert shared.to_dict()["transfer"] == {"alpha_s": shared.transfer_line.alpha,
                                            "beta_s_per_token": shared.transfer_line.beta, "sizes": 2}


def test_cpu_host_cost_fits_the_form_cpu_cost_evaluates(tmp_path):
    """benchmarks/cpu_host_cost.py prints cpu_cost.py's numbers: it must fit that estimate's form."""
    bench = load_benchmark("cpu_host_cost")
    layers = 2
    truth = Coefficients(PAIR_PER_LAYER_S * layers, CONTEXT_PER_LAYER_S * layers, STAGE_CALL_S)
    shapes = [(512, 0), (512, 512), (512, 7168), (1024, 0), (2048, 2048), (4096, 4096), (256, 100)]
    decisions = [{"seq": seq, "kind": "admit", "prefill": True, "requests": [seq], "tokens": c, "start": prefix}
                 for seq, (c, prefix) in enumerate(shapes)]
    records = [{"seq": seq, "is_prefill": True, "cpu_s": truth(c, prefix)} for seq, (c, prefix) in enumerate(shapes)]
    (tmp_path / "vpp_rank0.records.json").write_text(json.dumps({"decisions": decisions}))
    (tmp_path / "vpp_rank1.records.json").write_text(json.dumps({"records": records}))
    stage, pair, context = bench.fit(bench.fit_samples(tmp_path, layers), layers)
    assert (pair, context, stage.d) == pytest.approx((PAIR_PER_LAYER_S, CONTEXT_PER_LAYER_S, STAGE_CALL_S), rel=1e-6)
