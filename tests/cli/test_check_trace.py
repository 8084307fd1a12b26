"""``sglang-vpp check --trace DIR`` on hand-written traces: exit 0 / 1 / 2 (the server replay is in
tests/sglang_vpp)."""

import json

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app

CONTROLLER = {
    "mode": "vpp", "pp_size": 2, "stage_layers": [2, 2, 2, 2], "max_in_flight": None,
    "cost": {"kind": "linear-attention", "linear_per_token": 1e-6, "attention_per_pair": 1e-6 / 2048,
             "fixed_per_chunk": 0.0},
}


def _mb(seq, request, start, ends, **extra):
    return {"seq": seq, "requests": [request], "start": start, "tokens": 64, "ends_request": ends, "prefill": True,
            **extra}


LEADER = [
    {"kind": "admit", "decision": "yes", **_mb(0, "a", 0, False)},
    {"kind": "admit", "decision": "yes", **_mb(1, "a", 64, True)},
    {"kind": "hold", **_mb(2, "b", 0, True)},  # the barrier: a is still in flight
    {"kind": "pick", "ready": [[3, 0], [0, 2]], "chosen": [3, 0]},
    {"kind": "left", "seq": 0},
    {"kind": "left", "seq": 1},
    {"kind": "admit", "decision": "yes", **_mb(2, "b", 0, True)},
]
FOLLOWER = [{"kind": "pick", "ready": [[2, 0], [1, 1]], "chosen": [2, 0]}]


def _write(tmp_path, leader=LEADER, controller=CONTROLLER):
    for rank, decisions in ((0, leader), (1, FOLLOWER)):
        (tmp_path / f"vpp_rank{rank}.records.json").write_text(json.dumps(
            {"records": [], "counters": {}, "controller": controller, "decisions": decisions}))
    return str(tmp_path)


def test_a_trace_that_follows_the_controller_exits_0(tmp_path):
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "vpp trace: 2 ranks, 8 decisions, 3 micro-batches admitted (0 packed)" in result.output


def test_one_broken_decision_exits_1_naming_it(tmp_path):
    early = [dict(record) for record in LEADER]
    early[2] = {"kind": "admit", "decision": "yes", **_mb(2, "b", 0, True)}  # ignores the barrier
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path, early)])
    assert result.exit_code == 1
    assert "rank 0, decision 2, micro-batch 2: controller expected hold (no admission), server did admit" in result.output
    wrong_order = [dict(record) for record in LEADER]
    wrong_order[3] = {"kind": "pick", "ready": [[3, 0], [0, 2]], "chosen": [0, 2]}  # vpp drains first
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path, wrong_order), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)["divergence"]["index"] == 3


def test_unreadable_or_stock_traces_exit_2_with_one_line(tmp_path):
    missing = CliRunner().invoke(app, ["check", "--trace", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "is not a directory" in missing.output
    stock = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path, controller={})])
    assert stock.exit_code == 2 and "stock --pp-mode cpp / dcpp" in stock.output
    (tmp_path / "vpp_rank0.records.json").write_text("{not json")
    broken = CliRunner().invoke(app, ["check", "--trace", str(tmp_path)])
    assert broken.exit_code == 2 and "not a readable records file" in broken.output
    assert "Traceback" not in missing.output + stock.output + broken.output


def test_plan_check_still_needs_its_options():
    result = CliRunner().invoke(app, ["check", "--mode", "vpp"])
    assert result.exit_code == 2 and "missing --pp, --seq-len, --chunk-size" in result.output


def test_a_trace_missing_a_rank_of_its_pp_size_exits_2(tmp_path):
    _write(tmp_path)
    (tmp_path / "vpp_rank1.records.json").unlink()
    result = CliRunner().invoke(app, ["check", "--trace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "holds records of ranks [0], but the server ran pp_size 2" in result.output
    assert "Traceback" not in result.output


def test_plan_flags_next_to_trace_are_refused_not_ignored(tmp_path):
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path), "--mode", "vpp-pack", "--pp", "4"])
    assert result.exit_code == 2, result.output
    assert "drop --mode, --pp" in result.output


def test_plan_flags_with_defaults_next_to_trace_are_refused_too(tmp_path):
    """--requests and --layers have defaults: given explicitly (even at the default's value) they
    are still a plan the trace would ignore."""
    for flags in (["--requests", "3"], ["--layers", "48"], ["--requests", "1", "--layers", "8"]):
        result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path), *flags])
        assert result.exit_code == 2, (flags, result.output)
        assert f"drop {flags[0]}" in result.output
        assert "Traceback" not in result.output


def _edited(index, **fields):
    decisions = [dict(record) for record in LEADER]
    decisions[index] = {**decisions[index], **fields}
    return decisions


@pytest.mark.parametrize("leader,controller,message", [
    (LEADER, {**CONTROLLER, "cost": None}, "the trace's cost model is None"),
    ([{"kind": "pick", "ready": [], "chosen": [3, 0]}], CONTROLLER, "a pick needs at least one ready item"),
    ([{"kind": "chunk", "prefix": 0, "remaining": -100, "size": 0}], CONTROLLER, "remaining must be >= 1"),
    (3, CONTROLLER, "'decisions' is not a list"),
    # The plan fields: unchecked, int() says "invalid literal" and names no file or field.
    (LEADER, {**CONTROLLER, "stage_layers": "2,2,2,2"}, "vpp_rank0.records.json: controller stage_layers is "
     "'2,2,2,2', not a list of each stage's layer count, whole numbers >= 1 (e.g. [2, 2, 2, 2])"),
    (LEADER, {**CONTROLLER, "stage_layers": ["a", 2, 2, 2]}, "vpp_rank0.records.json: controller stage_layers is"),
    (LEADER, {**CONTROLLER, "stage_layers": [2.5, 2, 2, 2]}, "controller stage_layers is [2.5, 2, 2, 2], not a list"),
    (LEADER, {**CONTROLLER, "stage_layers": [2, 2]}, "vpp_rank0.records.json: controller inputs do not describe a "
     "layout: layer split [2, 2] has 2 entries"),
    (LEADER, {**CONTROLLER, "pp_size": "2"}, "vpp_rank0.records.json: controller pp_size is '2', not a whole number"),
    (LEADER, {**CONTROLLER, "mode": None}, "vpp_rank0.records.json: controller mode is None, not a VPP mode name"),
    (LEADER, {**CONTROLLER, "chunk_size": "x"}, "vpp_rank0.records.json: controller chunk_size is 'x', not a whole "
     "number >= 1 and <= 16777216 (or null)"),
    # A chunk of no tokens or past the largest size: an edit, not a server's chunker.
    (LEADER, {**CONTROLLER, "chunk_size": 10**20}, "controller chunk_size is 100000000000000000000, not a whole number"),
    (LEADER, {**CONTROLLER, "chunk_size": 1e20}, "controller chunk_size is 1e+20, not a whole number"),
    (LEADER, {**CONTROLLER, "chunk_size": 0}, "controller chunk_size is 0, not a whole number >= 1"),
    (LEADER, {**CONTROLLER, "chunk_size": -64}, "controller chunk_size is -64, not a whole number >= 1"),
    (LEADER, {**CONTROLLER, "auto_chunk_cap": 10**20}, "controller auto_chunk_cap is 100000000000000000000, not a"),
    (LEADER, {**CONTROLLER, "max_in_flight": "x"}, "controller max_in_flight is 'x', not a whole number >= 1"),
    # A NaN or negative time would replay as if it decided something.
    (LEADER, {**CONTROLLER, "cost": {**CONTROLLER["cost"], "linear_per_token": float("nan")}},
     "vpp_rank0.records.json: the trace's linear-attention cost has linear_per_token nan; expected seconds, a "
     "finite number >= 0"),
    (LEADER, {**CONTROLLER, "cost": {**CONTROLLER["cost"], "fixed_per_chunk": -1.0}}, "fixed_per_chunk -1.0"),
    (LEADER, {**CONTROLLER, "cost": {"kind": "fitted"}}, "the trace's fitted cost has model None"),
    (LEADER, {**CONTROLLER, "cost": {"kind": "fitted", "model": 3}}, "the trace's fitted cost has model 3"),
    # Decision fields out of range: int() alone would truncate 1.5 into another micro-batch's number.
    (_edited(0, seq=float("inf")), CONTROLLER, "seq must be a whole number >= 0, got inf"),
    (_edited(0, seq=1.5), CONTROLLER, "seq must be a whole number >= 0, got 1.5"),
    (_edited(0, start=-1), CONTROLLER, "start must be a whole number >= 0, got -1"),
    (_edited(0, requests="a"), CONTROLLER, "requests must be a list of request ids"),
    (_edited(3, chosen=[]), CONTROLLER, "chosen must be a [stage, micro-batch] pair, got []"),
    (_edited(3, ready=[[10**30, 0], [0, 2]]), CONTROLLER, "a ready item names a stage outside 0..3"),
    (_edited(3, ready=[[-1, 0], [0, 2]]), CONTROLLER, "a ready item names a stage outside 0..3"),
    (LEADER, {**CONTROLLER, "pp_size": 10**30}, "controller pp_size is 1000000000000000000000000000000, not at "
     "most the 4 stages of stage_layers"),
    (LEADER, {**CONTROLLER, "mode": "cpp"}, "controller mode is 'cpp', not a VPP mode name (vpp, vpp-async,"),
], ids=["no cost model", "pick of nothing", "negative chunk", "decisions not a list", "stage_layers text",
        "stage_layers letter", "stage_layers fraction", "stage_layers short", "pp_size text", "no mode",
        "chunk_size text", "chunk_size huge", "chunk_size huge float", "chunk_size 0", "chunk_size negative",
        "auto_chunk_cap huge", "max_in_flight text", "cost nan", "cost negative", "fitted without model",
        "fitted model not an object", "seq inf", "seq fraction", "negative start", "requests text",
        "pick of no item", "stage huge", "stage negative", "pp_size huge", "stock mode"])
def test_a_malformed_record_is_one_error_exit_2(tmp_path, leader, controller, message):
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path, leader, controller)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_micro_batch_admitted_twice_while_in_flight_is_a_divergence(tmp_path):
    result = CliRunner().invoke(app, ["check", "--trace", _write(tmp_path, _edited(1, seq=0))])
    assert result.exit_code == 1, result.output
    assert ("rank 0, decision 1, micro-batch 0: controller expected a micro-batch not already in flight, "
            "server did admit micro-batch 0 again while it was in flight") in result.output


@pytest.mark.parametrize("name", ["vpp_rank01.records.json", "vpp_rank+1.records.json", "vpp_rankX.records.json"])
def test_a_stray_records_file_is_refused_not_read_as_a_rank(tmp_path, name):
    """A copy named vpp_rank01 read as rank 1 and replaced (or was replaced by) vpp_rank1."""
    _write(tmp_path)
    (tmp_path / name).write_text((tmp_path / "vpp_rank1.records.json").read_text())
    result = CliRunner().invoke(app, ["check", "--trace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and f"{name!r} is not a rank's records file, named vpp_rank<r>.records.json" in lines[0]


def test_a_foreign_json_file_is_not_read_as_a_stock_trace(tmp_path):
    """A Perfetto trace (or any JSON object) copied under a records file's name read as a stock
    cpp/dcpp trace with no decisions."""
    _write(tmp_path)
    (tmp_path / "vpp_rank0.records.json").write_text(json.dumps({"traceEvents": []}))
    result = CliRunner().invoke(app, ["check", "--trace", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert ('vpp_rank0.records.json holds neither "records" nor "controller", so it is no records file a server '
            "wrote") in result.output
    assert "stock" not in result.output
