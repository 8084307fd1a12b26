"""Server vs planner order, without a server: a planner's own trace stands in for the server's
(the real servers' traces are compared in test_vpp_server.py and test_vpp_models.py)."""

from __future__ import annotations

import json

import pytest
from replan import replan

from sglang_vpp.schedule import LinearAttentionCost, RequestSpec, build_schedule
from sglang_vpp.serving.decision_replay import (
    DecisionRecorder,
    compare_decisions,
    load_trace,
    replay_trace,
    server_workload,
)
from sglang_vpp.trace_records import cost_record, records_file

LENGTHS = (256, 64, 192, 128)


def _planner_trace(mode, pp, tmp_path, monkeypatch, cost=None):
    """A trace in the server's format whose decisions a planner took (rank -> decisions)."""
    import sglang_vpp.schedule.factory as factory_module

    names = [f"r{i}" for i in range(len(LENGTHS))]
    recorders = []

    def recording(*args, **kwargs):
        recorders.append(DecisionRecorder(*args, names=names, **kwargs))
        return recorders[-1]

    with monkeypatch.context() as patch:
        patch.setattr(factory_module, "Controller", recording)
        build_schedule(mode, pp, 4 * pp, [RequestSpec(n) for n in LENGTHS], 64, cost=cost)
    cost = LinearAttentionCost()  # the trace says the default estimate was used, whatever the clock was
    inputs = {"mode": mode, "pp_size": pp, "stage_layers": [2] * (2 * pp), "max_in_flight": None,
              "chunk_size": 64, "cost": cost_record(cost)}
    for rank, decisions in recorders[0].decisions.items():
        records_file(tmp_path, rank).write_text(
            json.dumps({"records": [], "controller": inputs, "decisions": decisions}))
    return recorders[0].decisions


@pytest.mark.parametrize("mode", ["vpp", "vpp-async", "vpp-pack", "vpp-stream"])
@pytest.mark.parametrize("pp", [2, 4])
def test_simulator_and_runtime_planner_take_the_traced_decisions(mode, pp, tmp_path, monkeypatch):
    traced = _planner_trace(mode, pp, tmp_path, monkeypatch)
    workload = server_workload(tmp_path)
    assert workload.lengths == LENGTHS and workload.chunk_size == 64
    recorders, sim_order, runtime_order = replan(workload, monkeypatch)
    assert sim_order == runtime_order
    assert recorders[0].decisions == recorders[1].decisions
    inputs = load_trace(tmp_path)[0]["controller"]
    for rank in range(pp):
        comparison = compare_decisions(traced[rank], recorders[0].decisions[rank], rank, inputs)
        assert comparison.divergence is None and comparison.event_difference is None, comparison
        assert comparison.num_equal == len(traced[rank])
        assert comparison.num_compared == comparison.num_decisions
    assert replay_trace(tmp_path).ok


def test_a_changed_decision_diverges_and_a_changed_event_is_not_compared(tmp_path, monkeypatch):
    traced = _planner_trace("vpp-pack", 2, tmp_path, monkeypatch)
    inputs = load_trace(tmp_path)[0]["controller"]
    leader = traced[0]
    pick = next(i for i, r in enumerate(leader) if r["kind"] == "pick")
    other = next(item for item in leader[pick]["ready"] if item != leader[pick]["chosen"])
    flipped = [dict(r) for r in leader]
    flipped[pick] = {**leader[pick], "chosen": other}
    comparison = compare_decisions(flipped, leader, 0, inputs)
    assert comparison.divergence is not None and comparison.num_equal == pick
    assert "first" in comparison.divergence.describe()
    hold = next(i for i, r in enumerate(leader) if r["kind"] == "hold")
    admitted_early = [dict(r) for r in leader]
    admitted_early[hold] = {**leader[hold], "kind": "admit", "decision": "yes"}
    comparison = compare_decisions(admitted_early, leader, 0, inputs)
    assert comparison.divergence is not None and "expected hold" in comparison.divergence.describe()
    # Another clock (per-chunk overhead, flatter attention) orders the events of vpp differently;
    # vpp's decisions do not read the estimate, so every decision met in both places is equal.
    server = _planner_trace("vpp", 4, tmp_path, monkeypatch)
    other_clock = LinearAttentionCost(attention_per_pair=1e-6 / 16, fixed_per_chunk=1e-4)
    (tmp_path / "other").mkdir()
    planner = _planner_trace("vpp", 4, tmp_path / "other", monkeypatch, cost=other_clock)
    comparison = compare_decisions(server[0], planner[0], 0, load_trace(tmp_path)[0]["controller"])
    assert comparison.divergence is None and comparison.event_difference is not None
    assert 0 < comparison.num_compared < comparison.num_decisions
