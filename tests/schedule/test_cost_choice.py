"""The controller factory's estimate for an executor without a cost model of its own (an SGLang
server): the choice from its device, ``auto`` and cost profile (``factory.choose_cost``)."""

import json
import re

import pytest

from sglang_vpp.schedule import LinearAttentionCost, build_layout
from sglang_vpp.schedule.cpu_cost import HOST_GAP_PER_FORWARD_S, STAGE_CALL_S, cpu_serving_cost
from sglang_vpp.schedule.errors import CostModelError
from sglang_vpp.schedule.factory import choose_cost, read_cost_profile
from sglang_vpp.schedule.fitted_cost import FITTED_FORMAT, Coefficients, FittedCostModel

LAYOUT = build_layout(2, 8, "foldback")


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "costs.json"
    FittedCostModel({}, Coefficients(2e-9, 3e-7, 1e-4)).save(path)
    return str(path)


@pytest.mark.parametrize("on_cpu", [False, True])
@pytest.mark.parametrize("auto_chunk", [False, True])
def test_a_profile_wins_whatever_the_device_and_chunking(profile, on_cpu, auto_chunk):
    choice = choose_cost(LAYOUT, on_cpu=on_cpu, auto_chunk=auto_chunk, profile_path=profile)
    assert choice.model == FittedCostModel.load(profile)
    assert choice.source == f"fitted cost model from --vpp-cost-profile {profile}"


def test_cpu_with_auto_gets_the_measured_cpu_estimate():
    choice = choose_cost(LAYOUT, on_cpu=True, auto_chunk=True)
    assert choice.model == cpu_serving_cost(LAYOUT)
    # 4 stages of 2 layers: each stage's fixed cost is one stage call plus the host gap.
    assert sorted(choice.model.stages) == [0, 1, 2, 3]
    assert all(c.d == STAGE_CALL_S + HOST_GAP_PER_FORWARD_S and c.num_layers == 2
               for c in choice.model.stages.values())
    assert "host time per forward" in choice.source


@pytest.mark.parametrize("on_cpu, auto_chunk, warns", [
    (True, False, False),    # fixed chunks keep the ratios every packing rule was written on
    (False, False, False),
    (False, True, True),     # auto without per-forward costs: the log says what it will do
])
def test_otherwise_the_analytic_estimate(on_cpu, auto_chunk, warns):
    choice = choose_cost(LAYOUT, on_cpu=on_cpu, auto_chunk=auto_chunk)
    assert choice.model == LinearAttentionCost()
    assert "analytic linear + attention estimate (no --vpp-cost-profile)" in choice.source
    assert ("pick the smallest chunks" in choice.source) is warns


def test_equal_inputs_give_equal_estimates():
    assert choose_cost(LAYOUT, on_cpu=True, auto_chunk=True) == choose_cost(LAYOUT, on_cpu=True, auto_chunk=True)


def test_an_unreadable_profile_says_which_file_and_the_fix(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # the decoder's RecursionError, not a JSONDecodeError
    for path in (str(bad), str(tmp_path / "missing.json"), str(deep)):
        with pytest.raises(CostModelError, match=r"is not a readable fitted cost model .*'sglang-vpp bench --costs"):
            choose_cost(LAYOUT, on_cpu=True, auto_chunk=True, profile_path=path)
        with pytest.raises(CostModelError, match="bad.json|missing.json|deep.json"):
            read_cost_profile(path)


def test_a_profile_with_no_fit_is_refused_when_read(tmp_path):
    """Unchecked, it would pass the plugin's launch check and fail at the server's first estimate."""
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"format": FITTED_FORMAT, "version": 1, "stages": {}, "per_layer": None}))
    with pytest.raises(CostModelError, match=r"empty.json' is not a readable fitted cost model \(a sglang-vpp"
                                             r".fitted-cost file with no fit"):
        read_cost_profile(str(empty))


_FIT = {"a": 2e-9, "b": 3e-7, "d": 1e-4}


@pytest.mark.parametrize("profile_json, message", [
    # Unchecked, Python reads true as 1 and float() reads "1e-4": both pass as numbers.
    ({"per_layer": {**_FIT, "d": True}}, "per_layer coefficient d is True, not a finite number >= 0"),
    ({"per_layer": {**_FIT, "b": "3e-7"}}, "per_layer coefficient b is '3e-7', not a finite number >= 0"),
    ({"per_layer": {**_FIT, "rel_rmse": "0.1"}}, "per_layer rel_rmse is '0.1', not a finite number >= 0"),
    ({"per_layer": {**_FIT, "num_samples": 2.5}}, "per_layer num_samples is 2.5, not a whole number >= 0"),
    ({"per_layer": _FIT, "transfer": {"alpha": False, "beta": 1e-9}},
     "transfer coefficient alpha is False, not a finite number >= 0"),
    # Unchecked, a stage's layer count matches no stage, or true a 1-layer one.
    ({"stages": {"0": {**_FIT, "layers": True}}}, "stage 0 layers is True, not a whole number >= 1"),
    ({"stages": {"0": {**_FIT, "layers": 1.5}}}, "stage 0 layers is 1.5, not a whole number >= 1"),
    ({"stages": {"0": {**_FIT, "layers": 0}}}, "stage 0 layers is 0, not a whole number >= 1"),
    ({"stages": {"0": {**_FIT, "layers": -2}}}, "stage 0 layers is -2, not a whole number >= 1"),
    ({"stages": {"0": {**_FIT, "layers": "2"}}}, "stage 0 layers is '2', not a whole number >= 1"),
    ({"stages": {"-1": _FIT}}, "stage '-1' is not a stage index (a whole number >= 0)"),
    ({"meta": {"num_layers": True}, "per_layer": _FIT}, "meta num_layers is True, not a whole number >= 1"),
    ({"meta": {"num_layers": 4}, "stages": {"0": {**_FIT, "layers": 8}}},
     "stage 0 layers is 8, more than the measured model's meta num_layers 4"),
])
def test_a_profile_with_a_value_of_the_wrong_kind_is_refused_when_read(tmp_path, profile_json, message):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"format": FITTED_FORMAT, "version": 1, **profile_json}))
    with pytest.raises(CostModelError, match=re.escape(f"is not a readable fitted cost model (a malformed "
                                                       f"{FITTED_FORMAT} file (ValueError: {message})")):
        read_cost_profile(str(path))


@pytest.mark.parametrize("profile_json, message", [
    # Fitted per stage at pp 2 contiguous (2 stages of 4 layers): LAYOUT has 4 stages of 2.
    ({"stages": {"0": {**_FIT, "layers": 4}, "1": {**_FIT, "layers": 4}}},
     "was fitted for stages 0 (4 layers), 1 (4 layers) with no per-layer fit; used with a model of 8 layers in 4 "
     "foldback stages (2 ranks) of 2, 2, 2, 2 layers, and stages 0, 1, 2, 3 have no fit"),
    ({"meta": {"model": "tiny"}, "stages": {"0": _FIT, "1": _FIT}},
     "was fitted on tiny for stages 0, 1 with no per-layer fit; used with a model of 8 layers in 4 foldback stages "
     "(2 ranks) of 2, 2, 2, 2 layers, and stages 2, 3 have no fit"),
    # Per layer, but measured on a model of another depth: another model.
    ({"meta": {"model": "tiny", "num_layers": 4}, "per_layer": _FIT},
     "was measured on tiny with 4 layers; used with a model of 8 layers in 4 foldback stages (2 ranks) of 2, 2, 2, "
     "2 layers; measure this model"),
])
def test_a_profile_fitted_for_another_layout_is_refused_when_chosen(tmp_path, profile_json, message):
    """Unchecked, the server starts and fails at the first estimate of a stage without a fit."""
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"format": FITTED_FORMAT, "version": 1, **profile_json}))
    with pytest.raises(CostModelError, match=re.escape(f"{str(path)!r} {message}")):
        choose_cost(LAYOUT, on_cpu=False, auto_chunk=False, profile_path=str(path))
    read_cost_profile(str(path))  # readable: only its layout is wrong


def test_a_profile_fitted_for_this_layout_is_chosen(tmp_path):
    path = tmp_path / "costs.json"
    stages = {str(s.stage_index): {**_FIT, "layers": s.num_layers} for s in LAYOUT.stages}
    path.write_text(json.dumps({"format": FITTED_FORMAT, "meta": {"num_layers": 8}, "stages": stages}))
    assert sorted(choose_cost(LAYOUT, on_cpu=False, auto_chunk=False, profile_path=str(path)).model.stages) == [0, 1, 2, 3]
