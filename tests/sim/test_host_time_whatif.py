"""``benchmarks/host_time_whatif.py``: a sampled row of docs/figures/host_time_whatif.md matches
the code, the what-if moves only the host time of a rank's second forward, and a bad share is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def whatif():
    return load_benchmark("host_time_whatif")


def test_sampled_figure_row_matches_the_code(whatif):
    cell = whatif.run_cell("qwen3-coder-30b-a3b", "ascend-910c", 8, "short-4k", 1.0)
    row = whatif.table([cell]).splitlines()[-1]
    figure = (ROOT / "docs" / "figures" / "host_time_whatif.md").read_text()
    assert row in figure, f"{row}\nnot in the figure: run python benchmarks/host_time_whatif.py --markdown ..."


def test_the_preset_share_is_the_preset_and_the_gap_follows_the_share(whatif):
    from sglang_vpp.sim.preset_loader import load_hardware

    hw = load_hardware("ascend-910c")
    same = whatif.run_cell("deepseek-v3.1", "ascend-910c", 2, "long-64k", hw.revisit_overhead_s / hw.chunk_overhead_s)
    assert same["auto"]["scaled"] == same["auto"]["preset"]
    gaps = [whatif.run_cell("deepseek-v3.1", "ascend-910c", 2, "long-64k", share)["auto"]["scaled"]
            ["idle_by_cause_s"]["scheduling_gap"] for share in (0.0, 1.0)]
    # Share 0 leaves one iteration per micro-batch and rank; share 1 pays one per forward.
    assert 0.0 < gaps[0] < same["auto"]["preset"]["idle_by_cause_s"]["scheduling_gap"] < gaps[1]


def test_a_share_outside_zero_to_one_is_refused(whatif):
    with pytest.raises(SystemExit, match="--revisit-share must be within"):
        whatif.main(["--revisit-share", "1.5"])
