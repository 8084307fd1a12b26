"""The start-up profile fits three coefficients, so it times at least three points, whatever the
prompt (bench --seq-len 1 --chunk-size auto or 1 failed with the fitter's error)."""

import pytest

from sglang_vpp.runtime.models import resolve_model
from sglang_vpp.runtime.profile import FIT_POINTS, _points, profiled_cost_model


@pytest.mark.parametrize("chunk_size,max_length", [(1, 1), (2, 1), (1, 2), (32, 1)])
def test_a_one_or_two_token_prompt_still_gets_three_points(chunk_size, max_length):
    points = _points(chunk_size, max_length)
    assert len(set(points)) >= FIT_POINTS, points


def test_a_one_token_prompt_profiles_a_cost_model():
    cost = profiled_cost_model(resolve_model("tiny-qwen3", 0, 2), 1, 1)
    assert cost.meta["source"] == "runtime start-up profile"
