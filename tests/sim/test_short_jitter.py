"""``benchmarks/short_jitter.py``: a sampled row of docs/figures/short_jitter.md matches the code,
spread 0 is the exact run, ``--idle`` shows auto and each baseline over the seeds, and bad
arguments are refused before any run."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from sglang_vpp.sim.idle import IDLE_CAUSES

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
    varied = {draw: short_jitter.run_cell("deepseek-v3.1", "ascend-910c", 2, "short-4k", 0.05, 3, draw)
              for draw in short_jitter.DRAWS}
    for draw, cell in varied.items():
        assert cell["seeds"] == 3 and cell["ttft"].repeats == 3 and cell["draw"] == draw
        assert len(set(cell["ttft"].relative)) == 3  # each seed draws other stage times
    # The draw reaches the runs: vpp-stream's two stages per rank draw otherwise.
    assert varied["stage"]["ttft"].relative != varied["rank"]["ttft"].relative


def test_positive_is_auto_worse_in_both_metrics(short_jitter, monkeypatch):
    auto = {"ttft_s": 11.0, "throughput_tok_s": 90.0, "mode": "vpp-stream", "chunk": "auto",
            "auto_fixed": [8192], "auto_tapered": []}
    base = [{"ttft_s": 10.0, "throughput_tok_s": 100.0, "mode": "cpp", "chunk": 8192},
            {"ttft_s": 12.0, "throughput_tok_s": 110.0, "mode": "cpp", "chunk": 16384}]
    monkeypatch.setattr(short_jitter, "_runs", lambda *args: (auto, base))
    cell = short_jitter.run_cell("deepseek-v3.1", "ascend-910c", 2, "short-4k", 0.05, 2)
    assert (cell["ttft_base"], cell["tput_base"]) == ("cpp 8k", "cpp 16k")  # each metric its own best
    assert cell["ttft"].relative == pytest.approx((0.1, 0.1))  # auto's TTFT 10 % above
    assert cell["per_token"].relative == pytest.approx((110 / 90 - 1,) * 2)  # and its throughput below
    assert cell["ttft"].outcome == cell["per_token"].outcome == "slower"


def _run(mode: str, chunk, ttft: float, tput: float, first: float, makespan: float, upstream: float) -> dict:
    idle = dict.fromkeys(IDLE_CAUSES, 0.0) | {"upstream_wait": upstream}
    return {"mode": mode, "chunk": chunk, "auto_fixed": [8192] if chunk == "auto" else [], "auto_tapered": [],
            "ttft_s": ttft, "throughput_tok_s": tput, "first_ttft_s": first, "makespan_s": makespan,
            "bubble_s": upstream, "idle_by_cause_s": idle}


def test_idle_table_shows_auto_and_each_baseline_as_means_over_the_seeds(short_jitter, monkeypatch, capsys):
    def runs(cell, num_ranks, spread, draw, seed):
        k = 1.0 + seed  # seed 0 and 1: the means are the values at k = 1.5
        auto = _run("vpp-stream", "auto", 11.0 * k, 90.0, 2.0 * k, 20.0, 0.1 * k)
        return auto, [_run("cpp", 8192, 10.0 * k, 100.0, 1.0 * k, 21.0 * k, 0.2 * k),
                      _run("cpp", 16384, 12.0 * k, 110.0, 1.5, 19.0, 0.3)]

    monkeypatch.setattr(short_jitter, "_runs", runs)
    short_jitter.main(["--models", "deepseek-v3.1", "--pp", "2", "--workloads", "short-4k", "--jitter", "0.05",
                       "--jitter-by", "stage", "--seeds", "2", "--idle"])
    out = capsys.readouterr().out
    head, rows = out.split("mean over the seeds:")[1].strip().splitlines()[0], out.split("|---")[-1].splitlines()[1:]
    # Only upstream_wait is not zero: the one cause shown.
    assert head.endswith("| TTFT s | first TTFT s | makespan s | bubble s | upstream_wait |")
    idle = {cells[5]: cells[6:] for cells in (row.strip("| ").split(" | ") for row in rows)}
    # auto, the TTFT baseline (cpp 8k) and the throughput one (cpp 16k): TTFT, first TTFT, makespan, bubble, cause.
    assert idle == {"vpp-stream auto 8k": ["16.500", "3.000", "20.000", "0.150", "0.150"],
                    "cpp 8k": ["15.000", "1.500", "31.500", "0.300", "0.300"],
                    "cpp 16k": ["18.000", "1.500", "19.000", "0.300", "0.300"]}


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "1"], "--seeds must be at least 2"),
    (["--workloads", "short-4k,long-64k"], "unknown workload 'long-64k'"),
    (["--workloads", "short-4k,short-8k"], "unknown workload 'short-8k'"),
    (["--pp", "2,x"], "--pp takes comma-separated integers"),
    (["--models", "deepseek-v3.1,nope"], "--models: unknown model preset 'nope'"),
    (["--jitter", "0.05,x"], "comma-separated numbers"),
    (["--jitter", "1.5"], "must lie in \\[0, 1\\]"),
    (["--jitter-by", "stage,device"], "--jitter-by takes stage or rank"),
])
def test_bad_arguments_are_refused_before_any_run(short_jitter, monkeypatch, argv, message):
    def no_run(*args, **kwargs):
        raise AssertionError("a cell ran before the arguments were checked")

    monkeypatch.setattr(short_jitter, "run_cell", no_run)
    with pytest.raises(SystemExit, match=message):
        short_jitter.main(argv)


def test_markdown_names_the_command_the_run_and_then_the_table(short_jitter, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(short_jitter, "_runs", lambda *args: (
        _run("vpp-stream", "auto", 11.0, 90.0, 2.0, 20.0, 0.1), [_run("cpp", 8192, 10.0, 100.0, 1.0, 21.0, 0.2)]))
    out = tmp_path / "figure.md"
    short_jitter.main(["--models", "deepseek-v3.1", "--pp", "2", "--workloads", "short-4k", "--jitter", "0.05",
                       "--jitter-by", "stage", "--seeds", "2", "--markdown", str(out)])
    head, blank, *table = out.read_text().splitlines()
    assert head.startswith(f"Generated by `python benchmarks/short_jitter.py --markdown {out}` (ascend-910c, 1 rows, "
                           "2 seeds per spread above 0, ")
    assert "Positive % = vpp-stream with auto worse" in head and blank == ""
    assert "\n".join(table) == capsys.readouterr().out.strip()  # the table printed, as printed
