"""Printed tables fit 80 columns: ``bench`` (three narrow tables) and ``simulate`` (wide tables
split, the key columns repeated)."""

from types import SimpleNamespace

from typer.testing import CliRunner

from sglang_vpp.cli.app import app

from sglang_vpp.cli.bench_cmd import _NOTES, format_table
from sglang_vpp.schedule import Policy


def _mode(name: str, scale: float) -> SimpleNamespace:
    # Wall clock on a loaded host reaches tens of seconds with a wide range: the widest cells.
    spans = [scale * 5.123, scale * 19.456, scale * 11.0]
    return SimpleNamespace(mode=name, max_abs_diff=0.0, wall_s=spans, replay_makespan_s=[1.7, 1.9, 1.8],
                           equal_cost_makespan_s=[1.66, 1.68, 1.67], ttft_s=spans, replay_ttft_s=[1.3, 1.5, 1.4],
                           equal_cost_ttft_s=[1.27, 1.29, 1.28], compute_s=1.632, bubble_ratio=0.087,
                           replay_bubble_ratio=0.054, exposed_comm_s=0.4614, num_chunks=116)


def test_every_line_fits_80_columns_with_every_mode():
    report = SimpleNamespace(config=SimpleNamespace(repeat=3),
                             modes=[_mode(p.value, 1.0 + 4 * i) for i, p in enumerate(Policy)])
    text = format_table(report)
    for line in (text + "\n" + _NOTES).splitlines():
        assert len(line) <= 80, line
    for header in ("wall s", "replay makespan s", "equal-cost makespan s", "equal-cost TTFT s", "max|diff|"):
        assert header in text
    assert all(f"\n{p.value} " in text for p in Policy)
    assert "231.000 [107.583-408.576]" in text  # vpp-taper's wall clock (x21), the widest cell, whole


def test_simulate_splits_wide_tables_at_80_columns():
    # The mixed workload idles for five causes; a sweep marks each mode's best chunk size.
    args = ["simulate", "--workload", "mixed", "--requests", "40", "--sweep-chunk", "8k,24k"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    for header in ("TTFT s", "exp.comm s", "gap%", "upstream_wait", "rendezvous", "drain"):
        assert header in result.output
    # Every (chunk, mode) row appears in each split table: 2 chunk sizes x every mode x 4 tables.
    assert sum(1 for line in lines if line.split()[:1] == ["-"]) == 2 * len(Policy) * 4
    assert sum(1 for line in lines if "8k* " in line or "24k* " in line) == len(Policy) * 2


def test_the_notes_say_which_timeline_each_accounting_column_is_on():
    # "compute s" is the replay's and "exp comm s" this host's wall clock, side by side in one
    # table: without the notes saying so, compute + exp comm reads as a part of the replayed makespan.
    report = SimpleNamespace(config=SimpleNamespace(repeat=3), modes=[_mode("cpp", 1.0)])
    header = format_table(report).splitlines()[-3]
    assert "compute s" in header and "exp comm s" in header
    notes = " ".join(_NOTES.split())
    assert "compute s: per rank, replayed" in notes
    assert "exp comm s: per rank, measured on this host (wall clock" in notes
