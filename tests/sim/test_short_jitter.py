"""``benchmarks/short_jitter.py``: a sampled row of docs/figures/short_jitter.md matches the code,
spread 0 is the exact run, and bad arguments are refused before any run."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def short_jitter():
    return load_benchmark("short_jitter")


def test_sampled_figure_row_matches_the_code(short_jitter):
    cell = short_jitter.run_cell("deepseek-v3.1", "ascend-910c", 2, "short-4k", 0.05, short_jitter.SEEDS)
    row = short_jitter.table([cell]).splitlines()[-1]
    figure = (ROOT / "docs" / "figures" / "short_jitter.md").read_text()
    assert row in figure, f"{row}\nnot in the figure: run python benchmarks/short_jitter.py --markdown ..."


def test_spread_zero_is_one_exact_run_and_a_spread_varies_the_seeds(short_jitter):
    exact = short_jitter.run_cell("deepseek-v3.1", "ascend-910c", 2, "short-4k", 0.0, 3)
    assert exact["seeds"] == 1 and exact["ttft"].repeats == 1 and not exact["ttft"].significant
    assert exact["draw"] == "-"  # no draw at all
    for draw in short_jitter.DRAWS:
        varied = short_jitter.run_cell("deepseek-v3.1", "ascend-910c", 2, "short-4k", 0.05, 3, draw)
        assert varied["seeds"] == 3 and varied["ttft"].repeats == 3 and varied["draw"] == draw
        assert len(set(varied["ttft"].relative)) == 3  # each seed draws other stage times


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1"], "--seeds must be at least 2"),
    (["--workloads", "long-64k"], "is not a short cell"),
    (["--jitter", "0.05,x"], "comma-separated numbers"),
    (["--jitter", "1.5"], "must lie in \\[0, 1\\]"),
    (["--jitter-by", "stage,device"], "--jitter-by takes stage or rank"),
])
def test_bad_arguments_are_refused(short_jitter, argv, message):
    with pytest.raises(SystemExit, match=message):
        short_jitter.main(argv)
