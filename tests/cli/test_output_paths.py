"""Where the files a command writes go: a name that can only be a directory's is refused while the
command line is read (``Path`` would drop its trailing separator and the run would write a file
of the folder's name at its end), and missing parent folders are made."""

import json

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app

_SIMULATE = ["simulate", "--model", "qwen3-tiny", "--seq-len", "1k", "--chunk-size", "512", "--modes", "cpp"]


@pytest.mark.parametrize("command, flag", [
    (_SIMULATE, "--json"), (_SIMULATE, "--trace"), (_SIMULATE, "--plot"),
    (["bench", "--seq-len", "64", "--chunk-size", "16", "--requests", "2", "--modes", "cpp"], "--costs"),
    (["bench-serve", "--url", "http://127.0.0.1:9"], "--output-file"),
])
@pytest.mark.parametrize("ending", ["/", "/."])
def test_an_output_named_as_a_directory_is_refused_before_the_run(tmp_path, command, flag, ending):
    target = str(tmp_path / "outd") + ending
    result = CliRunner().invoke(app, [*command, flag, target])
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert error == [f"Error: Invalid value for '{flag}': {target!r} names a directory; give a file name inside it"]
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a file of its name


def test_json_to_stdout_is_still_taken():
    result = CliRunner().invoke(app, [*_SIMULATE, "--json", "-"])
    assert result.exit_code == 0, result.output


def test_missing_parent_folders_of_an_output_are_made(tmp_path):
    out, trace = tmp_path / "a" / "b" / "out.json", tmp_path / "t" / "trace.json"
    result = CliRunner().invoke(app, [*_SIMULATE, "--json", str(out), "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["results"] and trace.is_file()


def test_an_empty_output_name_is_refused():
    result = CliRunner().invoke(app, [*_SIMULATE, "--json", ""])
    assert result.exit_code == 2, result.output
    assert "Error: Invalid value for '--json': give a file name" in result.output


def test_a_file_named_dash_in_a_folder_is_a_file_not_stdout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*_SIMULATE, "--json", "./-"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "-").read_text())["results"]
