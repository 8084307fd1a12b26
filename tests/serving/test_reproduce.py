"""``check --trace DIR --reproduce`` on synthetic server traces: the engine's own run, written
in the server's format, reproduces record by record; an edited duration that crosses a
decision, two swapped records and an old trace do not."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.schedule import LinearAttentionCost, MicroBatch
from sglang_vpp.serving.decision_replay import TraceError, load_trace
from sglang_vpp.serving.reproduce import Build, MeasuredTimings, ModelTimings, ServerModel, reproduce_trace
from sglang_vpp.trace_records import (
    ARRIVALS,
    BUILDS,
    CLOCK_ORIGIN,
    SCHEMA,
    SCHEMA_VERSION,
    cost_record,
    records_file,
)

CHUNK = 64
REQUESTS = {"a": 5, "b": 1, "c": 3, "d": 2}
"""Request -> chunks of 64 tokens."""


def _inputs(mode: str, pp: int) -> dict:
    return {"mode": mode, "pp_size": pp, "stage_layers": [2] * (2 * pp), "max_in_flight": None,
            "chunk_size": CHUNK, "cost": cost_record(LinearAttentionCost())}


def _builds(pp: int, mode: str) -> list[Build]:
    """Each request's chunks in turn; "c" and "d" arrive while "a" prefills."""
    slots = ServerModel(_inputs(mode, pp), [], ModelTimings(lambda *_: 1.0)).ranks[0].controller.limits.slots
    builds, seq = [], 0
    for rid, chunks in REQUESTS.items():
        for k in range(chunks):
            mb = MicroBatch(seq, frozenset([rid]), k * CHUNK, CHUNK, k == chunks - 1)
            builds.append(Build(mb, seq % slots, 0.0 if rid in "ab" else 0.05))
            seq += 1
    return builds


def _durations(rank: int, stage: int, seq: int) -> float:
    """Uneven on purpose: rank 0 (stage 0 and the last stage) is the slowest, so fold-back work
    queues behind it and it picks; every fourth micro-batch is slower, so other ranks wait."""
    return (0.012 if rank == 0 else 0.005) + (0.007 if seq % 4 == 1 else 0.0)


def _write(model: ServerModel, trace_dir, pp: int) -> None:
    trace_dir.mkdir(parents=True, exist_ok=True)
    for state in model.ranks:
        records = [{"rank": state.rank, "is_prefill": True, "num_tokens": CHUNK, "cpu_s": 0.0, **c}
                   for c in state.computes]
        data = {SCHEMA: SCHEMA_VERSION, CLOCK_ORIGIN: 100.0, "records": records,
                "controller": model.inputs, "decisions": state.decisions, ARRIVALS: model.arrivals[state.rank],
                BUILDS: model.built if state.rank == 0 else []}
        records_file(trace_dir, state.rank).write_text(json.dumps(data))


def _synthetic(tmp_path, mode="vpp", pp=2):
    model = ServerModel(_inputs(mode, pp), _builds(pp, mode), ModelTimings(_durations, start=0.001))
    assert model.run() is None
    _write(model, tmp_path / "trace", pp)
    return tmp_path / "trace", model


@pytest.mark.parametrize("mode,pp", [("vpp", 2), ("vpp-async", 2), ("vpp-pack", 2), ("vpp-taper", 2),
                                     ("vpp-stream", 2), ("vpp", 4), ("vpp-async", 4),
                                     ("vpp-pack", 4)])
def test_a_run_written_as_a_server_trace_reproduces_record_by_record(mode, pp, tmp_path):
    trace, model = _synthetic(tmp_path, mode, pp)
    assert any(d["kind"] == "pick" for s in model.ranks for d in s.decisions)  # order was decided
    if mode != "vpp-stream":  # no request barrier: nothing waits at admission on this load
        assert any(d["kind"] == "hold" for d in model.ranks[0].decisions)  # admission was decided
    assert any(c["idle_s"] is not None for s in model.ranks for c in s.computes)  # ranks waited
    result = reproduce_trace(trace)
    assert result.ok, result.difference.describe()
    assert result.compared == {s.rank: len(s.computes) + len(s.decisions) for s in model.ranks}
    out = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce"])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[-1].startswith("reproduced record by record:"), out.output
    as_json = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce", "--json"])
    assert as_json.exit_code == 0, as_json.output
    reproduced = json.loads(as_json.output)["reproduce"]
    assert reproduced["ok"] and reproduced["compared"] == {str(r): n for r, n in result.compared.items()}


def test_an_edited_duration_that_crosses_a_decision_fails(tmp_path):
    trace, model = _synthetic(tmp_path)
    # Rank 0's first pick between the fold-back stage of one micro-batch and stage 0 of the next:
    # delay the fold-back stage's input (rank 1's stage 2) past that poll, and rank 0 sees one item.
    leader = model.ranks[0]
    pick = next(d for d in leader.decisions if d["kind"] == "pick")
    _, seq = pick["ready"][0]
    follower = {(c["stage"], c["seq"]): c for c in model.ranks[1].computes}
    assert (2, seq) in follower
    assert reproduce_trace(trace, _edited(trace, (1, 2, seq), 0.0)).ok
    edited = reproduce_trace(trace, _edited(trace, (1, 2, seq), 0.05))
    assert not edited.ok
    assert edited.difference.rank == 0 and edited.difference.stream == "decision", edited.difference.describe()
    assert "server recorded pick 3F" in edited.difference.describe()
    # A change too small to cross anything leaves every record equal.
    assert reproduce_trace(trace, _edited(trace, (1, 2, seq), 1e-7)).ok


def _edited(trace, key, delta):
    timings = MeasuredTimings(load_trace(trace))
    timings.edit_duration(*key, delta)
    return timings


def test_two_swapped_records_fail_with_the_first_difference(tmp_path):
    trace, model = _synthetic(tmp_path)
    path = records_file(trace, 1)
    data = json.loads(path.read_text())
    data["records"][3], data["records"][4] = data["records"][4], data["records"][3]
    path.write_text(json.dumps(data))
    out = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce"])
    assert out.exit_code == 1, out.output
    assert "REPRODUCE DIFFERENCE at rank 1, compute record 3:" in out.output, out.output
    assert all(len(line) <= 80 for line in out.output.splitlines()), out.output


def test_two_swapped_decisions_fail(tmp_path):
    trace, model = _synthetic(tmp_path)
    path = records_file(trace, 0)
    data = json.loads(path.read_text())
    kinds = [d["kind"] for d in data["decisions"]]
    i = next(i for i in range(len(kinds) - 1) if kinds[i] == "left" and kinds[i + 1] == "admit")
    data["decisions"][i], data["decisions"][i + 1] = data["decisions"][i + 1], data["decisions"][i]
    path.write_text(json.dumps(data))
    result = reproduce_trace(trace)
    assert not result.ok and result.difference.rank == 0 and result.difference.stream == "decision"
    assert result.difference.index == i, result.difference.describe()


def test_a_trace_without_timings_is_refused_with_the_fix(tmp_path):
    trace, _ = _synthetic(tmp_path)
    path = records_file(trace, 1)
    data = json.loads(path.read_text())
    del data[SCHEMA]
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="--reproduce needs a trace from this version"):
        reproduce_trace(trace)
    out = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce"])
    assert out.exit_code == 2 and "schema" in out.output, out.output


@pytest.mark.parametrize("edit", [lambda d: d.pop("records"), lambda d: d.update(records="abc")],
                         ids=["records missing", "records not a list"])
def test_a_hand_edited_records_file_is_one_error_exit_2(tmp_path, edit):
    trace, _ = _synthetic(tmp_path)
    path = records_file(trace, 0)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    out = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce"])
    assert out.exit_code == 2 and "unreadable timing records" in out.output, out.output


def _shift_first_poll(data: dict) -> None:
    data["records"][0]["poll_s"] -= 1.0  # a poll a second before the message that woke it


def _start_before_its_poll(data: dict) -> None:
    record = next(r for r in data["records"] if r["poll_s"] is not None)
    record["start_s"] = record["poll_s"] - 0.004  # its end kept: duration and host gap absorb the move


def _fold_start_before_its_first_stage_ends(data: dict) -> None:
    # rank 1 of pp 2 holds the fold: its stages 1 and 2 of a micro-batch run back to back
    index = next(i for i, r in enumerate(data["records"]) if r["stage"] == 2)
    data["records"][index]["start_s"] = data["records"][index - 1]["end_s"] - 0.003


@pytest.mark.parametrize("rank,edit,message", [
    (1, _shift_first_poll, "out of order"),
    # A start moved alone keeps its end, so every later record would still match.
    (1, _start_before_its_poll, "rank 1: records[0] starts 0.004000 s before the poll that chose it"),
    (1, _fold_start_before_its_first_stage_ends, "rank 1: records[1] starts 0.003000 s before records[0], its micro-batch's previous stage"),
    (0, lambda d: d[BUILDS][0].update(t_s=float("nan")), "builds[0].t_s is nan, not a finite time"),
    (0, lambda d: d["records"][1].update(poll_s=None), "records[1] has no poll_s"),
    (0, lambda d: d["records"][0].update(stage=99), "records[0].stage is 99, not one of the 4 stages"),
    (1, lambda d: d["records"][0].pop("end_s"), "records[0].end_s is missing"),
    (0, lambda d: d.update(schema="2"), "schema '2' is not a version number"),
    (1, lambda d: d.update(schema=3), "rank 1's schema 3 is newer than the 2 this version reads"),
    # Run as given, a negative duration still reproduced record by record (exit 0).
    (0, lambda d: d["records"][1].update(end_s=d["records"][1]["start_s"] - 0.5), "records[1] ends before it starts"),
    # Run as given, a build before the clock origin or in a slot SGLang lacks still reproduced (exit 0).
    (0, lambda d: d[BUILDS][0].update(t_s=-1), "builds[0].t_s is -1, not a finite time >= 0"),
    (0, lambda d: d[BUILDS][0].update(slot=10**20), "builds[0].slot is 100000000000000000000, not one of the 3"),
    (0, lambda d: d[BUILDS][1].update(slot=3), "builds[1].slot is 3, not one of the 3 micro-batch slots"),
    (0, lambda d: d[BUILDS][0].update(slot=1e20), "builds[0].slot is 1e+20, not a whole number"),
    (0, lambda d: d["controller"].update(chunk_size=10**20), "controller chunk_size is 100000000000000000000"),
    (0, lambda d: d["controller"].update(chunk_size=0), "controller chunk_size is 0, not a whole number >= 1"),
], ids=["poll before its wake", "start before its poll", "fold start before its first stage ends", "NaN build time", "no poll", "no such stage", "no end", "schema not a number",
        "schema newer", "end before start", "build before the origin", "slot huge", "slot past the last",
        "slot not whole", "chunk_size huge", "chunk_size 0"])
def test_timings_the_engine_cannot_run_are_one_error_exit_2_not_a_hang(tmp_path, rank, edit, message):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import sglang_vpp

    trace, _ = _synthetic(tmp_path)
    path = records_file(trace, rank)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    # A subprocess with a timeout: these traces once stalled the engine's clock for ever.
    out = subprocess.run([sys.executable, "-m", "sglang_vpp.cli.app", "check", "--trace", str(trace), "--reproduce"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(Path(sglang_vpp.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])})
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_compute_the_server_ran_at_another_stage_is_a_difference(tmp_path):
    trace, _ = _synthetic(tmp_path)
    path = records_file(trace, 0)
    data = json.loads(path.read_text())
    data["records"][0]["stage"] = 3  # rank 0 holds stages 0 and 3; the engine runs 0F0 first
    path.write_text(json.dumps(data))
    result = reproduce_trace(trace)
    assert not result.ok and result.difference.describe().startswith(
        "rank 0, compute record 0: engine expected 0F0, server recorded 3F0"), result.difference.describe()


def test_records_that_end_between_the_two_stages_of_the_fold_are_a_difference(tmp_path):
    """The engine read the fold's second stage's start from a record the server never wrote: an
    IndexError traceback."""
    trace, _ = _synthetic(tmp_path, "vpp-pack")
    path = records_file(trace, 1)
    data = json.loads(path.read_text())
    last = data["records"].pop()
    assert last["stage"] == 2  # rank 1's second stage of the fold, run right after its first
    path.write_text(json.dumps(data))
    out = CliRunner().invoke(app, ["check", "--trace", str(trace), "--reproduce"])
    assert out.exit_code == 1, out.output
    index = len(data["records"])
    assert f"REPRODUCE DIFFERENCE at rank 1, compute record {index}:" in out.output, out.output
    assert f"engine expected 2F{last['seq']}" in out.output and "nothing (its records end)" in out.output
