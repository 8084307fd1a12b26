"""Trace output: Perfetto events with pid = rank and tid = stream or group; a PNG from matplotlib."""

from __future__ import annotations

import json

from sglang_vpp.schedule import LinearAttentionCost, build_schedule
from sglang_vpp.sim import simulate_schedule
from sglang_vpp.sim.trace import perfetto_events, write_gantt_png, write_perfetto_trace


def _result(mode):
    cost = LinearAttentionCost(transfer_per_token=1e-6)
    return simulate_schedule(build_schedule(mode, 2, 8, [4096, 2048], 1024, cost=cost), cost)


def test_single_timeline_pid_is_rank_tid_is_group(tmp_path):
    result = _result("vpp-async")
    path = tmp_path / "t.json"
    write_perfetto_trace(result, path)
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    computes = [e for e in slices if e["cat"] == "compute"]
    assert len(computes) == sum(r.num_computes for r in result.per_rank) and {e["tid"] for e in computes} == {0}
    assert {e["tid"] for e in slices if e["cat"] == "send"} == {2, 3}  # fwd, bwd
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}


def test_labelled_timelines_and_gantt(tmp_path):
    runs = {"cpp": _result("cpp"), "vpp-pack": _result("vpp-pack")}
    events = perfetto_events(runs)
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1, 100, 101}
    png = tmp_path / "g.png"
    write_gantt_png(runs, png, title="test")
    assert png.read_bytes()[:4] == b"\x89PNG"
