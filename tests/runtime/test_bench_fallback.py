"""A dcpp whose profiled latency curve is flat runs fixed chunks and the bench report says so; the
reference runs where the ranks do."""

import pytest

from sglang_vpp.runtime import bench
from sglang_vpp.runtime.reference import ReferenceResult
from sglang_vpp.runtime.spec import Device
from sglang_vpp.schedule import LinearAttentionCost


def test_flat_profile_runs_dcpp_as_fixed_chunks_with_a_note(monkeypatch):
    # On a tiny model the profiled attention term can be zero: the curve is then linear and its
    # fitted square term is rounding noise of either sign.
    monkeypatch.setattr(bench, "profiled_cost_model", lambda *_a: LinearAttentionCost(attention_per_pair=0.0))
    config = bench.BenchConfig(model="tiny-qwen3", seq_len=96, chunk_size=32, modes=("cpp", "dcpp"),
                               num_requests=1, num_layers=2, repeat=1)
    report = bench.run_bench(config)
    assert len(report.notes) == 1 and report.notes[0].startswith("dcpp ran fixed 32-token chunks (cpp in effect)")
    assert report.to_json()["notes"] == report.notes
    assert all(m.max_abs_diff == 0.0 for m in report.modes)
    assert all(m.num_chunks == 3 for m in report.modes)  # 96 tokens in fixed chunks of 32


def test_curved_profile_has_no_note(monkeypatch):
    monkeypatch.setattr(bench, "profiled_cost_model", lambda *_a: LinearAttentionCost())
    config = bench.BenchConfig(model="tiny-qwen3", seq_len=96, chunk_size=32, modes=("dcpp",),
                               num_requests=1, num_layers=2, repeat=1)
    assert bench.run_bench(config).notes == []


@pytest.mark.parametrize(("device", "where"), [(Device.CPU, "cpu"), (Device.CUDA, "cuda:0"), (Device.NPU, "npu:0")])
def test_the_reference_runs_on_the_kind_of_device_the_ranks_run_on(monkeypatch, device, where):
    """A GPU run compared with a CPU reference may differ by more than the 1e-5 the CLI allows
    (other kernels); the reference of a run on a device runs on the first device of that kind."""
    seen = []

    def fake_reference(source, lengths, **kwargs):
        seen.append(kwargs["device"])
        return ReferenceResult([], [])

    monkeypatch.setattr(bench, "reference_forward", fake_reference)
    config = bench.BenchConfig(model="tiny-qwen3", seq_len=96, chunk_size=32, modes=("cpp",), num_requests=1,
                               num_layers=2, device=device)
    references = bench._References(None, config, bench.BenchProgress())
    references.get([(0, 0, 0, 96, True, ())])
    assert seen == [where]
