"""The layout / schedule / check commands: JSON contracts and exit codes."""

import json

from typer.testing import CliRunner

from sglang_vpp.cli.app import app

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, list(args))


def test_layout_json_contract():
    result = _run("layout", "--pp", "2", "--layers", "48", "--mode", "vpp", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["stages"][0] == {"stage": 0, "rank": 0, "layers": [0, 12]}
    assert [s["rank"] for s in data["stages"]] == [0, 1, 1, 0]


def test_layout_split_and_errors():
    result = _run("layout", "--pp", "2", "--layers", "10", "--mode", "vpp", "--split", "4,2,2,2", "--json")
    assert json.loads(result.output)["stages"][0]["layers"] == [0, 4]
    bad = _run("layout", "--pp", "2", "--layers", "10", "--mode", "vpp", "--split", "4,2,2,3")
    assert bad.exit_code == 2 and "sums to 11" in bad.output
    assert _run("layout", "--pp", "1", "--layers", "10", "--mode", "vpp").exit_code == 2
    assert _run("layout", "--pp", "2", "--layers", "10", "--split", "a,b").exit_code == 2


def test_schedule_text_and_json():
    text = _run("schedule", "--mode", "vpp-async", "--pp", "2", "--seq-len", "4k", "--chunk-size", "1k")
    assert text.exit_code == 0
    assert text.output.startswith("rank 0: 0F0.0 0SEND_F0.0>1@fwd")
    data = json.loads(_run("schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "4k", "--chunk-size", "1k",
                           "--requests", "2", "--format", "json").output)
    assert data["policy"] == "cpp" and len(data["ranks"]) == 2 and len(data["chunks"]) == 8


def test_unknown_mode_lists_valid_names():
    result = _run("schedule", "--mode", "zigzag", "--pp", "2", "--seq-len", "4k", "--chunk-size", "1k")
    assert result.exit_code == 2
    assert "vpp-pack" in result.output and "zigzag" in result.output


def test_check_exit_codes_and_json():
    ok = _run("check", "--mode", "vpp-pack", "--pp", "4", "--seq-len", "16k", "--chunk-size", "1k",
              "--requests", "3", "--json")
    assert ok.exit_code == 0
    data = json.loads(ok.output)
    assert data["valid"] and not data["deadlock"] and data["cycle"] == [] and data["actions"] > 0
    neg = _run("check", "--mode", "vpp-async", "--pp", "2", "--seq-len", "8k", "--chunk-size", "1k",
               "--groups", "1", "--json")
    assert neg.exit_code == 1
    data = json.loads(neg.output)
    assert data["deadlock"] and len(data["cycle"]) == 2
    assert (data["mode"], data["pp"], data["fold"], data["groups"], data["semantics"]) == (
        "vpp-async", 2, "split", ["pp"], "async")
    # The streams stop at the stall (docs/cli.md): the work after it never runs.
    assert not data["valid"] and any("never runs" in issue["message"] for issue in data["issues"])
    fused = json.loads(_run("check", "--mode", "vpp", "--pp", "2", "--seq-len", "8k", "--chunk-size", "1k",
                            "--fold", "fused", "--json").output)
    assert fused["fold"] == "fused" and fused["valid"]
    text = _run("check", "--mode", "vpp-async", "--pp", "2", "--seq-len", "8k", "--chunk-size", "1k", "--groups", "1")
    assert "deadlock" in text.output and "<-- ERROR HERE" in text.output
    assert _run("check", "--mode", "vpp", "--pp", "2", "--seq-len", "8k", "--chunk-size", "0").exit_code == 2


def test_check_header_names_a_fused_fold():
    fused = _run("check", "--mode", "vpp", "--pp", "2", "--seq-len", "8k", "--chunk-size", "1k", "--fold", "fused")
    assert fused.exit_code == 0, fused.output
    assert fused.output.splitlines()[0] == "vpp pp=2 (fused fold) groups=pp blocking sends, 56 actions"
    split = _run("check", "--mode", "vpp", "--pp", "2", "--seq-len", "8k", "--chunk-size", "1k")
    assert split.output.splitlines()[0] == "vpp pp=2 groups=pp blocking sends, 64 actions"
