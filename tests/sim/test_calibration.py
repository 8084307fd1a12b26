"""The shipped ascend-910c preset reproduces the method doc's calibration table and trend."""

from __future__ import annotations

import pytest

from sglang_vpp.sim.calibration import METHOD_DOC_TABLE, errors, evaluate, nelder_mead, trend
from sglang_vpp.sim.preset_loader import load_hardware, load_model


@pytest.fixture(scope="module")
def specs():
    return load_model("deepseek-v3.1"), load_hardware("ascend-910c")


def test_each_row_within_ten_percent(specs):
    rows = evaluate(*specs)
    for (mode, row), error in errors(rows).items():
        assert abs(error) < 0.10, f"{mode} {row}: simulated {rows[mode][row]:.2f}, measured " \
                                  f"{METHOD_DOC_TABLE.rows[mode][row]:.2f} ({100 * error:+.1f}%)"
    assert rows["dcpp"]["steps"] > 3 * rows["cpp"]["steps"]  # the doc: 4.4x more steps


def test_trend_dcpp_ahead_at_64k_to_256k_behind_at_512k(specs):
    deltas = trend(*specs, METHOD_DOC_TABLE.trend_lengths, METHOD_DOC_TABLE.trend_chunk_sizes)
    for length in METHOD_DOC_TABLE.trend_lengths[:-1]:
        assert -0.06 < deltas[length] < -0.01, (length, deltas)
    assert deltas[METHOD_DOC_TABLE.trend_lengths[-1]] > 0


def test_nelder_mead_finds_a_quadratic_minimum():
    point, value = nelder_mead(lambda p: (p[0] - 1.5) ** 2 + (p[1] + 2) ** 2, [0.0, 0.0], iterations=300)
    assert point == pytest.approx([1.5, -2.0], abs=1e-3) and value < 1e-6
