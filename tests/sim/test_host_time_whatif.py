"""``benchmarks/host_time_whatif.py``: a sampled row of docs/figures/host_time_whatif.md matches
the code, the scaled run pays exactly the scaled host time per forward, and a bad share is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def whatif():
    return load_benchmark("host_time_whatif")


def test_sampled_figure_row_matches_the_code(whatif):
    cell = whatif.run_cell("qwen3-coder-30b-a3b", "ascend-910c", 8, "short-4k", 0.5)
    row = whatif.table([cell]).splitlines()[-1]
    figure = (ROOT / "docs" / "figures" / "host_time_whatif.md").read_text()
    assert row in figure, f"{row}\nnot in the figure: run python benchmarks/host_time_whatif.py --markdown ..."


def test_a_share_of_one_is_the_preset_and_zero_removes_the_gap(whatif):
    same = whatif.run_cell("deepseek-v3.1", "ascend-910c", 2, "long-64k", 1.0)
    assert same["auto"]["scaled"] == same["auto"]["preset"]
    none = whatif.run_cell("deepseek-v3.1", "ascend-910c", 2, "long-64k", 0.0)
    assert none["auto"]["scaled"]["idle_by_cause_s"]["scheduling_gap"] == 0.0
    assert none["auto"]["preset"]["idle_by_cause_s"]["scheduling_gap"] > 0.0


def test_a_share_outside_zero_to_one_is_refused(whatif):
    with pytest.raises(SystemExit, match="--vpp-host-share must be within"):
        whatif.main(["--vpp-host-share", "1.5"])
