"""The planner (hence the simulator and the runtime, which execute its streams) and the SGLang
server are checked by the same replay: the planner's controller calls, recorded in the server's
trace format, replay through ``check --trace`` without a divergence."""

import json

import pytest

from sglang_vpp.schedule import LinearAttentionCost, RequestSpec, build_schedule
from sglang_vpp.serving.decision_replay import DecisionRecorder, replay_trace
from sglang_vpp.trace_records import cost_record, records_file

COST = LinearAttentionCost()


@pytest.mark.parametrize("mode", ["vpp", "vpp-async", "vpp-pack", "vpp-stream"])
@pytest.mark.parametrize("pp", [2, 4])
def test_planner_decisions_replay_like_a_server(mode, pp, tmp_path, monkeypatch):
    import sglang_vpp.schedule.factory as factory_module

    recorders = []

    def recording(*args, **kwargs):
        recorders.append(DecisionRecorder(*args, **kwargs))
        return recorders[-1]

    monkeypatch.setattr(factory_module, "Controller", recording)
    # Different lengths, some chunked and some not; the last arrives while the first prefills.
    requests = [RequestSpec(700), RequestSpec(37), RequestSpec(300), RequestSpec(128, arrival=1e-4)]
    build_schedule(mode, pp, 4 * pp, requests, 64, cost=COST)
    recorder = recorders[0]
    layers = [4 * pp // (2 * pp)] * (2 * pp)
    inputs = {"mode": mode, "pp_size": pp, "stage_layers": layers, "max_in_flight": None, "chunk_size": 64,
              "cost": cost_record(COST)}
    for rank, decisions in recorder.decisions.items():
        records_file(tmp_path, rank).write_text(
            json.dumps({"records": [], "controller": inputs, "decisions": decisions}))
    result = replay_trace(tmp_path)
    assert result.ok, result.divergence.describe()
    assert result.num_admitted == recorder.num_admitted > 0
    in_flight, deepest = 0, 0
    for d in recorder.decisions[0]:
        in_flight += {"admit": 1, "left": -1}.get(d["kind"], 0)
        deepest = max(deepest, in_flight)
    if mode == "vpp-stream":
        assert deepest > 2 * pp - 1  # the deep window was used
    else:
        assert any(d["kind"] == "hold" for d in recorder.decisions[0])  # the barrier acted
        assert deepest <= 2 * pp - 1 + (2 * pp - 1 if mode == "vpp-pack" else 0)
    assert (result.num_packed > 0) == (mode == "vpp-pack")
    # Rank 0 chose its last stage over a new stage 0 (vpp-stream once the V is full; vpp always).
    finished_first = [d for d in recorder.decisions[0] if d["kind"] == "pick"
                      and any(stage == 0 for stage, _ in d["ready"]) and d["chosen"][0] == 2 * pp - 1]
    assert bool(finished_first) == (mode in ("vpp", "vpp-stream"))


def _write_trace(tmp_path, mode: str, pp: int, decisions: list[dict]) -> None:
    layers = [2] * (2 * pp)
    inputs = {"mode": mode, "pp_size": pp, "stage_layers": layers, "max_in_flight": None, "chunk_size": 64,
              "cost": cost_record(COST)}
    for rank in range(pp):
        records_file(tmp_path, rank).write_text(
            json.dumps({"records": [], "controller": inputs, "decisions": decisions}))


def test_decode_slot_choices_replay_and_a_wrong_one_diverges(tmp_path):
    joins = [{"kind": "decode", "from_slot": 1, "running": [[0, 4], [3, 2]], "chosen": 3},
             {"kind": "decode", "from_slot": 2, "running": [[3, 2]], "chosen": 3},
             {"kind": "decode", "from_slot": 4, "running": [], "chosen": None}]
    _write_trace(tmp_path, "vpp-pack", 2, joins)
    assert replay_trace(tmp_path).ok
    wrong = [{**joins[0], "chosen": 0}]
    _write_trace(tmp_path, "vpp-pack", 2, wrong)
    result = replay_trace(tmp_path)
    assert not result.ok
    assert "join decode slot 3" in result.divergence.describe()


@pytest.mark.parametrize("record, expected", [
    # Slot 0 decodes: its own requests never move, so no record can come from it.
    ({"kind": "decode", "from_slot": 0, "running": [[3, 2]], "chosen": 3}, "no move: slot 0 is a decode slot"),
    # Slot 2 runs prefill only, so it can never be a choice.
    ({"kind": "decode", "from_slot": 1, "running": [[2, 0], [3, 2]], "chosen": 2}, "decode slots [3] to choose"),
    # A hold while decode slot 3 was open: the requests had to join it.
    ({"kind": "decode", "from_slot": 2, "running": [[3, 2]], "chosen": None}, "expected join decode slot 3 of {3: 2}, server did hold"),
    # A join while every decode slot was in flight: the requests had to be held.
    ({"kind": "decode", "from_slot": 2, "running": [], "chosen": 0}, "expected hold (no decode slot open), server did join"),
])
def test_a_decode_record_the_controller_would_not_write_diverges(tmp_path, record, expected):
    _write_trace(tmp_path, "vpp-pack", 2, [record])
    result = replay_trace(tmp_path)
    assert not result.ok and expected in result.divergence.describe()
