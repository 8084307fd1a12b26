"""``sglang-vpp simulate``: flags, table, JSON fields, trace and plot files, user errors."""

from __future__ import annotations

import json

import pytest

from typer.testing import CliRunner

from sglang_vpp.cli.app import app

RUNNER = CliRunner()
FIELDS = {"mode", "chunk_size", "ttft_s", "throughput_tok_s", "makespan_s", "compute_s", "bubble_s",
          "exposed_comm_s", "bubble_ratio", "steps"}


def test_simulate_table_json_trace_plot(tmp_path):
    out, trace, plot = tmp_path / "out.json", tmp_path / "trace.json", tmp_path / "gantt.png"
    result = RUNNER.invoke(app, ["simulate", "--model", "deepseek-v3.1", "--hardware", "ascend-910c", "--pp", "2",
                                 "--workload", "long", "--seq-len", "128k", "--chunk-size", "24k",
                                 "--modes", "cpp,dcpp,vpp,vpp-async,vpp-pack", "--json", str(out),
                                 "--trace", str(trace), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    for mode in ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"):
        assert f" {mode} " in result.output
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["results"]] == ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]
    assert FIELDS <= set(data["results"][0])
    assert all(r["chunk_size"] == 24576 for r in data["results"])
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] % 100 for e in slices} == {0, 1}
    assert any(e["name"] == "0F0.0" for e in slices)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_marks_the_best_chunk(tmp_path):
    out = tmp_path / "sweep.json"
    result = RUNNER.invoke(app, ["simulate", "--model", "qwen3-coder-30b-a3b", "--hardware", "h200", "--pp", "4",
                                 "--seq-len", "64k", "--modes", "cpp,vpp-pack", "--sweep-chunk", "8k,16k",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "*" in result.output
    rows = json.loads(out.read_text())["results"]
    assert {(r["mode"], r["chunk_size"]) for r in rows} == {(m, c) for m in ("cpp", "vpp-pack") for c in (8192, 16384)}
    assert all(r["makespan_s"] >= r["lower_bound_s"] * (1 - 1e-9) for r in rows)


def test_the_star_names_its_metric_and_the_table_prints_it():
    # Batched short prompts: vpp-pack's lowest TTFT is at 8k, its smallest makespan at 16k. The
    # star follows the makespan, so the table prints the makespan and says what the star means.
    result = RUNNER.invoke(app, ["simulate", "--pp", "4", "--workload", "short", "--seq-len", "8k", "--requests",
                                 "16", "--sweep-chunk", "8k,16k", "--modes", "vpp-pack"])
    assert result.exit_code == 0, result.output
    assert "smallest makespan" in result.output
    rows = {}
    for line in result.output.splitlines():
        cells = line.split()
        if "makespan s" in line:
            column = cells.index("s") - 1  # "makespan s" is two words: its value is the cell under "makespan"
        elif len(cells) > 3 and cells[2] == "vpp-pack" and "%" in cells[3]:
            rows[cells[1]] = float(cells[column])
    assert set(rows) == {"8k", "16k*"}, rows
    assert rows["16k*"] < rows["8k"]


def test_the_title_names_jitter_and_balance_like_the_json_config(tmp_path):
    # Jittered durations and a chosen split move every number; the text must say so, as the JSON does.
    out = tmp_path / "out.json"
    result = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--chunk-size", "8k", "--modes", "cpp",
                                 "--jitter", "0.025", "--jitter-seed", "3", "--balance", "auto", "--json", str(out)])
    assert result.exit_code == 0, result.output
    title = " ".join(result.output.split("   seq")[0].split())
    config = json.loads(out.read_text())["config"]
    assert (config["jitter"], config["jitter_seed"], config["balance"]) == (0.025, 3, "auto")
    assert "jitter 2.5% (seed 3)" in title and "--balance auto" in title
    plain = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--chunk-size", "8k", "--modes", "cpp"])
    assert "jitter" not in plain.output and "balance" not in plain.output


def _doc_names(section: str) -> list[str]:
    """The metric names in the first column of a table of docs/metrics.md under ``section``."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in body.splitlines() if line.startswith("| ") and "---" not in line]
    return [re.sub(r"\[.*", "", name) for row in rows[1:] for name in re.findall(r"`([^`]+)`", row)[-1:]]


def test_every_metric_docs_metrics_names_is_in_the_json(tmp_path):
    out = tmp_path / "out.json"
    result = RUNNER.invoke(app, ["simulate", "--workload", "short", "--seq-len", "8k", "--requests", "3",
                                 "--chunk-size", "8k", "--modes", "cpp,vpp-pack", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    row = data["results"][0]
    per_run, per_rank = _doc_names("Per run"), _doc_names("Per rank (`per_rank[r]`, `RankStats`)")
    assert "request_release_s" in per_run and "num_transfers" in per_run and "busy_until" in per_rank
    missing = [n for n in per_run if n not in row and n not in data]
    missing += [n for n in per_rank if n not in row["per_rank"][0]]
    assert not missing, missing
    assert len(row["request_ttft_s"]) == 3 and abs(sum(row["request_ttft_s"].values()) / 3 - row["ttft_s"]) < 1e-12


def test_short_and_mixed_workloads():
    short = RUNNER.invoke(app, ["simulate", "--model", "qwen3-coder-30b-a3b", "--hardware", "h200", "--workload",
                                "short", "--seq-len", "4k", "--requests", "8", "--chunk-size", "8k",
                                "--modes", "cpp,vpp-pack"])
    assert short.exit_code == 0, short.output
    mixed = RUNNER.invoke(app, ["simulate", "--model", "qwen3-tiny", "--hardware", "cpu", "--workload", "mixed",
                                "--requests", "30", "--chunk-size", "4k", "--modes", "cpp,vpp"])
    assert mixed.exit_code == 0, mixed.output


def test_user_errors_exit_2_with_the_fix():
    bad_model = RUNNER.invoke(app, ["simulate", "--model", "gpt-5", "--seq-len", "64k"])
    assert bad_model.exit_code == 2 and "valid:" in bad_model.output
    bad_mode = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--modes", "cpp,fast"])
    assert bad_mode.exit_code == 2 and "valid modes" in bad_mode.output
    no_len = RUNNER.invoke(app, ["simulate", "--workload", "short"])  # long has a default length
    assert no_len.exit_code == 2 and "--seq-len" in no_len.output


@pytest.mark.parametrize("flag, value", [("--tp", "0"), ("--tp", "-3"), ("--requests", "0"), ("--concurrency", "0")])
def test_bad_counts_are_one_line_errors(flag, value):
    result = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--modes", "cpp", flag, value])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} must be >= 1") and value in lines[0]


def test_balance_auto_reports_its_split_choice_and_refuses_a_manual_split(tmp_path):
    out = tmp_path / "balance.json"
    ok = RUNNER.invoke(app, ["simulate", "--pp", "2", "--seq-len", "64k", "--chunk-size", "8k", "--modes", "vpp-pack",
                             "--balance", "auto", "--json", str(out)])
    assert ok.exit_code == 0, ok.output
    data = json.loads(out.read_text())
    assert data["config"]["balance"] == "auto" and data["results"][0]["mode"] == "vpp-pack"
    both = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--balance", "auto", "--split", "31,30"])
    assert both.exit_code == 2 and both.output.strip().startswith("error: --balance auto chooses the layer split")
    bad = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--balance", "best"])
    assert bad.exit_code == 2 and "--balance must be one of even, auto" in bad.output


def test_chunk_size_auto(tmp_path):
    out = tmp_path / "auto.json"
    result = RUNNER.invoke(app, ["simulate", "--pp", "2", "--workload", "long", "--seq-len", "128k",
                                 "--sweep-chunk", "16k,auto", "--modes", "cpp,vpp-pack", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "  auto  vpp-pack" in result.output or "  auto* vpp-pack" in result.output
    rows = json.loads(out.read_text())["results"]
    auto = [r for r in rows if "auto_chunk_sizes" in r]
    assert [r["mode"] for r in auto] == ["cpp", "vpp-pack"]
    assert all(len(r["auto_chunk_sizes"]) == 1 for r in auto)
    bad = RUNNER.invoke(app, ["simulate", "--seq-len", "64k", "--chunk-size", "autox"])
    assert bad.exit_code != 0 and "autox" in bad.output


def test_simulate_refuses_a_file_the_long_workload_would_ignore(tmp_path):
    from typer.testing import CliRunner

    from sglang_vpp.cli.app import app

    path = tmp_path / "reqs.jsonl"
    path.write_text('{"length": 1024}\n')
    result = CliRunner().invoke(app, ["simulate", "--file", str(path), "--modes", "cpp"])
    assert result.exit_code == 2 and "the long workload does not read --file" in result.output


def test_an_auto_rows_json_chunk_size_reads_auto_not_the_cap(tmp_path):
    out = tmp_path / "auto.json"
    result = RUNNER.invoke(app, ["simulate", "--workload", "short", "--requests", "3", "--seq-len", "8k",
                                 "--chunk-size", "auto", "--modes", "cpp,vpp-pack", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert all(r["chunk_size"] == "auto" and r["auto_chunk_sizes"] for r in rows)


def test_measured_costs_are_named_in_the_title_not_the_hardware_preset(tmp_path):
    costs = tmp_path / "fit.json"
    costs.write_text(json.dumps({"format": "sglang-vpp.fitted-cost", "meta": {"model": "tiny-qwen3"},
                                 "per_layer": {"a": 1e-10, "b": 1e-6, "d": 1e-4}}))
    result = RUNNER.invoke(app, ["simulate", "--costs", str(costs), "--seq-len", "4k", "--chunk-size", "1k",
                                 "--modes", "cpp"])
    assert result.exit_code == 0, result.output
    title = result.output.split("   seq")[0]
    assert "measured costs" in title and "tiny-qwen3" in title and "ascend-910c" not in title, title


def test_a_fitted_cost_run_names_no_hardware_in_the_json_config(tmp_path):
    # The fitted file times every stage itself: the default preset was never read, so naming it would
    # credit the numbers to hardware that did not make them. A table file still reads the preset.
    costs, out = tmp_path / "fit.json", tmp_path / "out.json"
    costs.write_text(json.dumps({"format": "sglang-vpp.fitted-cost", "meta": {"model": "tiny-qwen3"},
                                 "per_layer": {"a": 1e-10, "b": 1e-6, "d": 1e-4}}))
    result = RUNNER.invoke(app, ["simulate", "--costs", str(costs), "--seq-len", "4k", "--chunk-size", "1k",
                                 "--modes", "cpp", "--json", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())["config"]
    assert "hardware" in config and config["hardware"] is None and config["tp"] is None, config
    assert config["cost_model"] == "FittedCostModel"


@pytest.mark.parametrize("model, warned", [("deepseek-v3.1", True), ("qwen3-tiny", False)])
def test_costs_of_another_depth_than_the_model_are_warned_about(tmp_path, model, warned):
    """--model sets only the layer count the measured per-layer cost is multiplied by: a costs
    file measured on a model of another depth says so in one stderr line (qwen3-tiny: 4 layers)."""
    costs = tmp_path / "fit.json"
    costs.write_text(json.dumps({"format": "sglang-vpp.fitted-cost", "meta": {"model": "tiny-x", "num_layers": 4},
                                 "per_layer": {"a": 1e-10, "b": 1e-6, "d": 1e-4}}))
    result = CliRunner().invoke(app, ["simulate", "--costs", str(costs), "--model", model,
                                     "--seq-len", "4k", "--chunk-size", "1k", "--modes", "cpp"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    if warned:
        assert warnings == [f"warning: --costs {costs} was measured on tiny-x with 4 layers; --model deepseek-v3.1 "
                            "has 61: the measured per-layer cost is scaled to 61 layers"]
    else:
        assert not warnings and not result.stderr.strip()


def test_a_size_given_twice_runs_once(tmp_path):
    """Like a mode given twice: 1k,auto,1024 printed and wrote the 1k rows twice."""
    out = tmp_path / "out.json"
    result = RUNNER.invoke(app, ["simulate", "--seq-len", "8k,8192", "--sweep-chunk", "1k,auto,1024", "--modes", "cpp",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [(r["seq_len"], r["chunk_size"] if not r.get("auto_chunk_sizes") else "auto") for r in rows] == [
        (8192, 1024), (8192, "auto")]


def test_a_rate_under_ten_tokens_per_second_is_not_printed_as_zero(tmp_path):
    """A slow hardware preset finishes with well under 1 tok/s, which whole numbers print as 0."""
    from importlib import resources

    hardware = json.loads((resources.files("sglang_vpp.sim") / "presets" / "hardware" / "cpu.json").read_text())
    path = tmp_path / "slow.json"
    path.write_text(json.dumps({**hardware, "peak_flops": 1.0}))
    result = RUNNER.invoke(app, ["simulate", "--model", "qwen3-tiny", "--hardware", str(path), "--seq-len", "1k",
                                 "--chunk-size", "256", "--modes", "cpp"])
    assert result.exit_code == 0, result.output
    row = next(line.split() for line in result.output.splitlines() if line.split()[2:3] == ["cpp"])
    assert float(row[4]) > 0 and "e-" in row[4], row
