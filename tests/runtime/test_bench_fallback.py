"""A dcpp whose profiled latency curve is flat runs fixed chunks and the bench report says so."""

from sglang_vpp.runtime import bench
from sglang_vpp.schedule import LinearAttentionCost


def test_flat_profile_runs_dcpp_as_fixed_chunks_with_a_note(monkeypatch):
    # On a tiny model the profiled attention term can be zero: the curve is then linear and its
    # fitted square term is rounding noise of either sign.
    monkeypatch.setattr(bench, "profiled_cost_model", lambda *_a: LinearAttentionCost(attention_per_pair=0.0))
    config = bench.BenchConfig(model="tiny-qwen3", seq_len=96, chunk_size=32, modes=("cpp", "dcpp"),
                               num_requests=1, num_layers=2)
    report = bench.run_bench(config)
    assert len(report.notes) == 1 and report.notes[0].startswith("dcpp ran fixed 32-token chunks (cpp in effect)")
    assert report.to_json()["notes"] == report.notes
    assert all(m.max_abs_diff == 0.0 for m in report.modes)
    assert all(m.num_chunks == 3 for m in report.modes)  # 96 tokens in fixed chunks of 32


def test_curved_profile_has_no_note(monkeypatch):
    monkeypatch.setattr(bench, "profiled_cost_model", lambda *_a: LinearAttentionCost())
    config = bench.BenchConfig(model="tiny-qwen3", seq_len=96, chunk_size=32, modes=("dcpp",),
                               num_requests=1, num_layers=2)
    assert bench.run_bench(config).notes == []
