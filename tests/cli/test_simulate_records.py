"""What ``simulate``'s JSON and tables record of the runs it made, beyond the numbers: the layer
split each run used (``--balance auto`` chooses one that the flags do not name) and the key of
``run_lower_bound_s`` for a workload without one prompt length."""

import json

from typer.testing import CliRunner

from sglang_vpp.cli.app import app

# qwen3-coder-30b-a3b has 48 layers; --balance auto gives cpp's two ranks an uneven split here.
_AUTO = ["simulate", "--model", "qwen3-coder-30b-a3b", "--hardware", "h200", "--seq-len", "8k",
         "--chunk-size", "2k", "--modes", "cpp,vpp"]


def _run(tmp_path, *flags):
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, [*flags, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())


def test_balance_auto_records_and_prints_the_split_it_chose(tmp_path):
    output, data = _run(tmp_path, *_AUTO, "--balance", "auto")
    splits = {row["mode"]: row["split"] for row in data["results"]}
    assert [len(splits["cpp"]), len(splits["vpp"])] == [2, 4] and all(sum(s) == 48 for s in splits.values())
    assert splits["cpp"] != [24, 24]  # the choice moves the numbers: the record must tell it from an even run
    assert data["config"]["split"] is None  # config keeps the flags as given
    table = output.split("layer split chosen by --balance auto\n", 1)[1]
    for mode, split in splits.items():
        assert any(line.split()[2:] == [mode, ",".join(map(str, split))] for line in table.splitlines()), output


def test_an_even_run_records_its_split_and_prints_no_choice(tmp_path):
    output, data = _run(tmp_path, *_AUTO)
    assert [row["split"] for row in data["results"]] == [[24, 24], [12, 12, 12, 12]]
    assert "chosen by --balance auto" not in output


def test_run_lower_bound_is_keyed_by_the_workload_where_it_has_no_one_length(tmp_path):
    _, mixed = _run(tmp_path, "simulate", "--model", "qwen3-tiny", "--hardware", "cpu", "--workload", "mixed",
                    "--requests", "4", "--chunk-size", "512", "--modes", "cpp")
    assert list(mixed["run_lower_bound_s"]) == ["mixed"]
    assert mixed["run_lower_bound_s"]["mixed"] == mixed["results"][0]["lower_bound_s"]
    _, long = _run(tmp_path, "simulate", "--model", "qwen3-tiny", "--seq-len", "1k,2k", "--chunk-size", "512",
                   "--modes", "cpp")
    assert list(long["run_lower_bound_s"]) == ["1024", "2048"]  # a length's key is unchanged
