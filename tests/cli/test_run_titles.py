"""What ``simulate`` and ``bench`` say of the run they made: the title (and simulate's JSON
``config``) names every setting that moves the numbers (a run on ``--split`` cannot pass for an
even one), and the title names none that moved nothing (a fused fold of modes without a fold)."""

import json

from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.cli.common import folds_any

# qwen3-tiny has 4 layers: cpp at pp=2 splits them 2,2 unless told otherwise.
_RUN = ("simulate", "--model", "qwen3-tiny", "--seq-len", "1k", "--chunk-size", "512")


def _run(tmp_path, *flags, base=_RUN):
    """(the title, the JSON's config, the first mode's result row) of ``simulate`` with ``flags``."""
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, [*base, *flags, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    return " ".join(result.output.split("   seq")[0].split()), data["config"], data["results"][0]


def test_a_given_split_is_named_in_the_title_and_the_json_config(tmp_path):
    title, config, row = _run(tmp_path, "--modes", "cpp", "--split", "3,1")
    assert config["split"] == [3, 1] and "layer split 3,1," in title
    even_title, even, even_row = _run(tmp_path, "--modes", "cpp")
    assert row["makespan_s"] != even_row["makespan_s"]  # the split moves the numbers, so the record must tell the runs apart
    assert even["split"] is None and "layer split" not in even_title


def test_the_title_names_a_fused_fold_only_where_a_mode_has_a_fold(tmp_path):
    """cpp and dcpp have no fold and run as always under --fold fused (bench titles alike, by ``folds_any``)."""
    contiguous, config, _ = _run(tmp_path, "--modes", "cpp,dcpp", "--fold", "fused")
    assert "fused fold" not in contiguous and config["fold"] == "fused"  # the JSON keeps the flag as given
    with_vpp, _, _ = _run(tmp_path, "--modes", "cpp,vpp", "--fold", "fused")
    assert "fused fold" in with_vpp
    assert not folds_any(["cpp", "dcpp"], "fused") and folds_any("dcpp,vpp-pack", "fused")
    assert not folds_any("vpp", "split")


def test_the_bench_title_names_the_settings_that_move_its_numbers(monkeypatch):
    """Printed before the ranks start; the run itself is stopped there (no rank process starts)."""
    from sglang_vpp.runtime import bench
    from sglang_vpp.runtime.errors import RankFailedError

    def stop(*args, **kwargs):
        raise RankFailedError("stopped by the test")

    monkeypatch.setattr(bench, "run_bench", stop)
    base = ["bench", "--quiet", "--seq-len", "64", "--chunk-size", "16", "--requests", "2", "--modes", "vpp"]
    result = CliRunner().invoke(app, [*base, "--split", "1,3,3,1", "--arrival-interval", "0.25", "--no-partial-fill"])
    title = " ".join(result.output.split("error:")[0].split())
    assert "layer split 1,3,3,1, arrivals 0.25 s apart, whole requests only" in title, result.output
    plain = CliRunner().invoke(app, [*base, "--no-batch-requests"])
    assert "one request per forward" in plain.output
    assert not any(word in plain.output for word in ("layer split", "arrivals", "whole requests")), plain.output
    filled = CliRunner().invoke(app, base).output
    assert "sglang-vpp bench:" in filled and "whole requests" not in filled  # filling is the default


def test_simulate_fills_as_sglangs_adder_by_default_and_names_whole_requests_only_when_told(tmp_path):
    """Three 700-token prompts at 512: filled, every forward but the last is full (5 forwards);
    whole, each prompt's 188-token tail runs alone (6)."""
    short = ("simulate", "--model", "qwen3-tiny", "--chunk-size", "512", "--modes", "cpp", "--workload", "short",
             "--requests", "3", "--seq-len", "700")

    def run(*flags):
        return _run(tmp_path, *flags, base=short)

    filled_title, filled, filled_row = run()
    whole_title, whole, whole_row = run("--no-partial-fill")
    assert filled["partial_fill"] is True and "whole requests" not in filled_title
    assert whole["partial_fill"] is False and "whole requests only," in whole_title
    assert (filled_row["num_chunks"], whole_row["num_chunks"]) == (5, 6)
    assert filled_row["makespan_s"] < whole_row["makespan_s"]
    assert run("--partial-fill") == (filled_title, filled, filled_row)
