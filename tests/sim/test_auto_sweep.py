"""``benchmarks/auto_sweep.py``: sampled cells of the table in docs/auto-chunk.md match the code,
in a long cell auto is the best swept size of the VPP mode (vpp-stream), and in a short cell at
P = 4 the idle table's rows (vpp-stream auto, vpp-pack auto, cpp) match too."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("auto_sweep")


@pytest.mark.parametrize("model,pp,workload", [
    ("deepseek-v3.1", 2, "long-64k"), ("qwen3-coder-30b-a3b", 4, "long-64k"), ("qwen3-coder-30b-a3b", 2, "short-4k"),
    ("glm-5.2", 4, "short-16k"),
])
def test_sampled_doc_rows_match_the_code(bench, model, pp, workload):
    cell = bench.run_cell(model, "ascend-910c", pp, workload)
    row = bench.table([cell]).splitlines()[-1]
    doc = (ROOT / "docs" / "auto-chunk.md").read_text()
    assert row in doc, f"{row}\nnot in docs/auto-chunk.md: run python benchmarks/auto_sweep.py --markdown docs/auto-chunk.md"
    if workload.startswith("short"):
        for line in bench.idle_table([cell]).splitlines()[2:]:
            assert line in doc, f"{line}\nnot in docs/auto-chunk.md"
        assert "vpp-pack auto" in bench.idle_table([cell])
    if workload.startswith("long"):
        best = cell["best"]["vpp_tput"]["throughput_tok_s"]
        assert cell["auto"]["throughput_tok_s"] >= best * 0.995


@pytest.mark.parametrize("model,pp,workload", [("qwen3-coder-30b-a3b", 4, "long-64k"),
                                               ("qwen3-coder-30b-a3b", 4, "short-4k")])
def test_sampled_fold_table_rows_match_the_code(bench, model, pp, workload):
    """The fused-fold table of docs/method.md ("The fused fold") is this code's."""
    cells = [bench.run_cell(model, "ascend-910c", pp, workload, fold=fold) for fold in ("split", "fused")]
    assert cells[1]["fold"] == "fused"
    row = bench.fold_table(cells[:1], cells[1:]).splitlines()[-1]
    doc = (ROOT / "docs" / "method.md").read_text()
    assert row in doc, f"{row}\nnot in docs/method.md: run python benchmarks/auto_sweep.py --fold both"


def test_sampled_partial_fill_row_matches_the_code(bench):
    """docs/auto-chunk.md's partial-fill table ("Partial fill") is this code's, and partial fill
    changes the cell it is cited for."""
    cell = bench.run_cell("qwen3-coder-30b-a3b", "ascend-910c", 4, "short-16k", partial_fill=True)
    row = bench.table([cell]).splitlines()[-1]
    doc = (ROOT / "docs" / "auto-chunk.md").read_text()
    block = doc[doc.index(bench.PARTIAL_FILL_BEGIN):doc.index(bench.PARTIAL_FILL_END)]
    assert row in block, (f"{row}\nnot in docs/auto-chunk.md's partial-fill table: run python benchmarks/auto_sweep.py "
                          "--workloads short-4k,short-16k,mixed --partial-fill --markdown docs/auto-chunk.md")
    assert row not in doc[doc.index(bench.BEGIN):doc.index(bench.END)]
