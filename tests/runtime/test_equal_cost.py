"""The equal-cost replay's shared cost model: it recovers known costs and treats every mode alike."""

from __future__ import annotations

import pytest

from sglang_vpp.runtime.equal_cost import MeasuredRunCosts, SharedCostModel, equal_cost_replay
from sglang_vpp.schedule import RequestSpec, build_schedule
from sglang_vpp.sim.cost.samples import CostSample

FIXED, EMBED, HEAD = 2e-3, 1e-3, 5e-4


def _layer(prefix: int, tokens: int) -> float:
    return 1e-6 * tokens + 1e-9 * tokens * (prefix + tokens)


def _samples(schedule, noise: float = 0.0):
    """One sample per stage and chunk, from the known truth (plus a constant overcharge)."""
    last = schedule.layout.num_stages - 1
    samples = []
    for stage in schedule.layout.stages:
        for chunk in schedule.chunks:
            truth = (FIXED + EMBED * (stage.stage_index == 0) + HEAD * (stage.stage_index == last)
                     + stage.num_layers * _layer(chunk.start, chunk.num_tokens))
            samples.append(CostSample("compute", stage.stage_index, chunk.request_index, chunk.chunk_index,
                                      chunk.start, chunk.num_tokens, truth + noise, stage.num_layers))
    return samples


def _plan(mode: str):
    return build_schedule(mode, 2, 8, [RequestSpec(2048), RequestSpec(2048)], 256)


def test_recovers_fixed_and_per_layer_costs_from_two_layouts():
    runs = [MeasuredRunCosts(plan.policy, plan.layout, _samples(plan)) for plan in (_plan("cpp"), _plan("vpp"))]
    model = SharedCostModel.fit(runs)
    assert model.fixed == pytest.approx((FIXED, EMBED, HEAD), rel=1e-6, abs=1e-9)
    assert model.per_layer[((512, 256),)] == pytest.approx(_layer(512, 256), rel=1e-6)
    assert model.rel_rmse < 1e-9


def test_least_disturbed_sample_wins_and_modes_share_the_costs():
    cpp, vpp = _plan("cpp"), _plan("vpp")
    clean = [MeasuredRunCosts(cpp.policy, cpp.layout, _samples(cpp)), MeasuredRunCosts(vpp.policy, vpp.layout, _samples(vpp))]
    # A disturbed second copy of every measurement (a neighbour stretched them) changes nothing.
    disturbed = clean + [MeasuredRunCosts(cpp.policy, cpp.layout, _samples(cpp, noise=1e-3)),
                         MeasuredRunCosts(vpp.policy, vpp.layout, _samples(vpp, noise=1e-3))]
    arrivals = {0: 0.0, 1: 0.0}
    first = SharedCostModel.fit(clean)
    second = SharedCostModel.fit(disturbed)
    for plan in (cpp, vpp):
        assert equal_cost_replay(plan, first, arrivals).makespan_s == pytest.approx(
            equal_cost_replay(plan, second, arrivals).makespan_s, rel=1e-9)


def test_unmeasured_chunk_position_is_an_error():
    cpp = _plan("cpp")
    model = SharedCostModel.fit([MeasuredRunCosts(cpp.policy, cpp.layout, _samples(cpp))])
    other = build_schedule("cpp", 2, 8, [RequestSpec(1000)], 300)
    with pytest.raises(KeyError, match="no measured forward"):
        equal_cost_replay(other, model, {0: 0.0})


def test_unmeasured_chunk_position_falls_back_when_given():
    cpp, other = _plan("cpp"), build_schedule("cpp", 2, 8, [RequestSpec(1000)], 300)
    everything = SharedCostModel.fit([MeasuredRunCosts(cpp.policy, cpp.layout, _samples(cpp)),
                                      MeasuredRunCosts(other.policy, other.layout, _samples(other))])
    partial = SharedCostModel.fit([MeasuredRunCosts(cpp.policy, cpp.layout, _samples(cpp))], fallback=everything)
    assert equal_cost_replay(other, partial, {0: 0.0}).makespan_s == pytest.approx(
        equal_cost_replay(other, everything, {0: 0.0}).makespan_s)


def test_shapes_many_modes_ran_are_not_favoured():
    """Three fold-back modes share their shapes; one lucky sample among them must not make their
    costs lower than those of a shape only one mode ran under the same disturbance."""
    cpp, vpp = _plan("cpp"), _plan("vpp")
    overcharge = 1e-3
    uniform = SharedCostModel.fit([MeasuredRunCosts("cpp", cpp.layout, _samples(cpp, overcharge))] +
                                  [MeasuredRunCosts(m, vpp.layout, _samples(vpp, overcharge)) for m in ("a", "b", "c")])
    lucky = SharedCostModel.fit([MeasuredRunCosts("cpp", cpp.layout, _samples(cpp, overcharge)),
                                 MeasuredRunCosts("a", vpp.layout, _samples(vpp, overcharge)),
                                 MeasuredRunCosts("b", vpp.layout, _samples(vpp)),
                                 MeasuredRunCosts("c", vpp.layout, _samples(vpp, overcharge))])
    arrivals = {0: 0.0, 1: 0.0}
    assert equal_cost_replay(vpp, lucky, arrivals).makespan_s == pytest.approx(
        equal_cost_replay(vpp, uniform, arrivals).makespan_s, rel=1e-9)


def test_a_batched_forward_is_not_merged_with_a_chunk_of_as_many_tokens():
    """Four 256-token prompts in one forward and one 1024-token chunk at the same lead prefix
    have the same total tokens but different costs: the model keeps both."""
    layout = _plan("cpp").layout
    batched = CostSample("compute", 0, 0, 0, 0, 256, 0.010, 4, batch=((0, 256), (0, 256), (0, 256)))
    whole = CostSample("compute", 0, 4, 0, 0, 1024, 0.030, 4)
    also = [CostSample("compute", 1, 0, 0, 0, 256, 0.011, 4, batch=((0, 256), (0, 256), (0, 256))),
            CostSample("compute", 1, 4, 0, 0, 1024, 0.031, 4)]
    model = SharedCostModel.fit([MeasuredRunCosts("cpp", layout, [batched, whole, *also])])
    assert batched.total_tokens == whole.total_tokens
    assert set(model.per_layer) == {batched.parts, whole.parts}
    for sample in (batched, whole):
        assert model.compute(4, True, False, sample.parts) == pytest.approx(sample.duration_s, rel=0.1)
