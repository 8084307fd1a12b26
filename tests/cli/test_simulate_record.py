"""What ``simulate`` records of the layer split it ran: the title and the JSON's ``config`` name
every setting that moves the numbers, so a run on ``--split`` cannot pass for an even one."""

import json

from typer.testing import CliRunner

from sglang_vpp.cli.app import app

# qwen3-tiny has 4 layers: cpp at pp=2 splits them 2,2 unless told otherwise.
_RUN = ["simulate", "--model", "qwen3-tiny", "--seq-len", "1k", "--chunk-size", "512", "--modes", "cpp"]


def _run(tmp_path, *flags):
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, [*_RUN, *flags, "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    return " ".join(result.output.split("   seq")[0].split()), data["config"], data["results"][0]["makespan_s"]


def test_a_given_split_is_named_in_the_title_and_the_json_config(tmp_path):
    title, config, makespan = _run(tmp_path, "--split", "3,1")
    assert config["split"] == [3, 1] and "layer split 3,1," in title
    even_title, even, even_makespan = _run(tmp_path)
    assert makespan != even_makespan  # the split moves the numbers, so the record must tell the runs apart
    assert even["split"] is None and "layer split" not in even_title
