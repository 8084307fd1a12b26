"""``sglang-vpp bench`` end to end: the table, the JSON fields the issue names, trace, plot, costs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sglang_vpp.runtime.bench import JSON_FIELDS
from sglang_vpp.schedule.auto_size import AUTO_CAP

pytestmark = pytest.mark.slow

EXPECTED_FIELDS = ("mode", "max_abs_diff", "wall_s", "replay_makespan_s", "compute_s", "bubble_ratio",
                   "replay_bubble_ratio", "exposed_comm_s", "ttft_s")


def test_json_fields_are_frozen():
    assert JSON_FIELDS == EXPECTED_FIELDS


def test_bench_command_surface():
    """The flags of issue 5 exist (a rename would break the README and scripts)."""
    import typer.main
    from sglang_vpp.cli.app import app

    command = next(c for c in typer.main.get_command(app).commands.values() if c.name == "bench")
    flags = {opt for param in command.params for opt in param.opts}
    assert {"--backend", "--model", "--pp", "--seq-len", "--chunk-size", "--modes", "--requests", "--repeat",
            "--json", "--trace", "--plot", "--device"} <= flags


def test_bench_runs_every_mode(tmp_path):
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--backend", "gloo", "--model", "tiny-qwen3",
         "--pp", "2", "--seq-len", "320", "--chunk-size", "48", "--requests", "2", "--repeat", "2", "--quiet",
         "--json", str(out), "--trace", str(tmp_path / "trace.json"), "--plot", str(tmp_path / "gantt.png"),
         "--costs", str(tmp_path / "costs.json")],
        capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr
    table = completed.stdout
    for mode in ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"):
        assert f"\n{mode} " in table
    assert "replay makespan s" in table and "dedicated-hardware" in table
    assert "equal-cost makespan s" in table
    assert "verdict (equal-cost makespan):" in table and "verdict (equal-cost TTFT):" in table
    assert "vpp-pack vs cpp: " in table and "vpp-pack vs dcpp: " in table
    assert max(len(line) for line in table.splitlines() if not line.startswith("wrote ")) <= 80

    data = json.loads(out.read_text())
    results = data["results"]
    assert [r["mode"] for r in results] == ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]
    for row in results:
        assert tuple(row)[: len(EXPECTED_FIELDS)] == EXPECTED_FIELDS
        assert row["max_abs_diff"] == 0.0
        for name in ("wall_s", "replay_makespan_s", "ttft_s", "equal_cost_makespan_s", "equal_cost_ttft_s"):
            assert len(row[name]) == 2 and all(v > 0 for v in row[name])
            assert row["stats"][name]["min"] <= row["stats"][name]["median"] <= row["stats"][name]["max"]
        assert 0.0 <= row["bubble_ratio"] < 1.0 and 0.0 <= row["replay_bubble_ratio"] < 1.0
        assert row["compute_s"] > 0 and row["exposed_comm_s"] >= 0
    assert len(data["equal_cost_models"]) == 2  # one shared cost model per repeat
    assert all(model["fixed_s"]["fixed"] >= 0 for model in data["equal_cost_models"])
    verdicts = {v["metric"]: v for v in data["verdicts"]}
    assert set(verdicts) == {"equal-cost makespan", "equal-cost TTFT"}
    pairs = {(c["mode"], c["baseline"]) for c in verdicts["equal-cost makespan"]["comparisons"]}
    assert ("vpp-pack", "cpp") in pairs and ("cpp", "dcpp") in pairs and len(pairs) == 8
    assert all(c["outcome"] in ("faster", "slower", "no significant difference")
               for v in verdicts.values() for c in v["comparisons"])

    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert any("measured wall clock" in n for n in names) and any("replayed on dedicated hardware" in n for n in names)
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from sglang_vpp.schedule.fitted_cost import FittedCostModel
    from sglang_vpp.sim.cost.samples import read_samples

    fitted = FittedCostModel.load(tmp_path / "costs.json")
    assert fitted.per_layer is not None and fitted.per_layer.a >= 0
    # tiny-qwen3's 8 layers: simulate --costs warns when --model has another depth.
    assert fitted.meta["model"] == "tiny-qwen3" and fitted.meta["num_layers"] == 8
    samples = read_samples(tmp_path / "costs.vpp-pack.json")
    assert {s.kind for s in samples} == {"compute", "transfer"}
    assert all(s.num_layers == 2 for s in samples if s.kind == "compute")


def test_bench_fused_fold_equals_reference(tmp_path):
    """``bench --fold fused``: the vpp modes run on the fused fold (2P-1 stages) and still equal
    the single-process reference; cpp has no fold and runs as always."""
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--pp", "3", "--modes", "cpp,vpp,vpp-stream",
         "--fold", "fused", "--seq-len", "256", "--chunk-size", "64", "--requests", "2", "--repeat", "1",
         "--quiet", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr
    assert "fused fold" in completed.stderr
    data = json.loads(out.read_text())
    assert data["config"]["fold"] == "fused"
    assert [r["mode"] for r in data["results"]] == ["cpp", "vpp", "vpp-stream"]
    assert all(r["max_abs_diff"] == 0.0 for r in data["results"])


def test_auto_batches_short_prompts_into_shared_forwards(tmp_path):
    """``--chunk-size auto`` on prompts far shorter than a useful forward: the size it picks may
    take several whole prompts into one forward (fewer forwards than prompts), and every output
    still equals the reference."""
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--model", "tiny-qwen3", "--pp", "2",
         "--seq-len", "128", "--chunk-size", "auto", "--requests", "8", "--modes", "cpp,vpp-pack",
         "--repeat", "1", "--quiet", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False)
    assert completed.returncode == 0, completed.stderr
    data = json.loads(out.read_text())
    assert data["config"]["auto_chunk"] and data["config"]["chunk_size"] == AUTO_CAP
    for row in data["results"]:
        assert row["max_abs_diff"] == 0.0
        assert row["num_chunks"] < 8, row
