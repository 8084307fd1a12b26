"""Real multi-process runs (gloo, CPU): every mode equals the single-process reference.

One rank pool per world size serves every run of the module, so process start-up is paid once.
"""

from __future__ import annotations

import pytest
from sglang_vpp.runtime.metrics import measure_run
from sglang_vpp.runtime.models import resolve_model
from sglang_vpp.runtime.replay import cost_samples, replay_run
from sglang_vpp.runtime.spec import RequestArrival, RunSpec, Timeouts
from sglang_vpp.schedule import validate_schedule

pytestmark = pytest.mark.slow

MODES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]


def _spec(mode: str, ranks: int, lengths, chunk: int, model: str = "tiny-qwen3", arrivals=None, **kw) -> RunSpec:
    arrivals = arrivals or [0.0] * len(lengths)
    requests = tuple(RequestArrival(n, a) for n, a in zip(lengths, arrivals))
    # The pools of conftest.py are built with these timeouts; a run must carry the same.
    timeouts = Timeouts(comm_s=60.0, control_s=60.0, startup_s=180.0, run_s=240.0, grace_s=5.0)
    return RunSpec(model, mode, ranks, requests, chunk, timeouts=timeouts, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths,chunk", [
    ([192, 96, 64], 32),    # chunk divides every length; three requests
    ([150, 77], 48),        # chunk divides neither; a short tail chunk
    ([61], 64),             # one chunk only (shorter than the chunk size)
])
def test_two_ranks_equal_reference(pool2, matches_reference, mode, lengths, chunk):
    result = pool2.run(_spec(mode, 2, lengths, chunk))
    assert matches_reference(result) == 0.0  # same operations, same shapes: exact


@pytest.mark.parametrize("mode", MODES)
def test_four_ranks_equal_reference(pool4, matches_reference, mode):
    result = pool4.run(_spec(mode, 4, [200, 90], 40))
    assert matches_reference(result) == 0.0


@pytest.mark.parametrize("ranks", [2, 4])
def test_vpp_stream_equals_reference(pool2, pool4, matches_reference, ranks):
    # Three requests streaming through the V: later requests enter while earlier ones are in flight.
    result = (pool2 if ranks == 2 else pool4).run(_spec("vpp-stream", ranks, [192, 96, 64], 32))
    assert matches_reference(result) == 0.0


@pytest.mark.parametrize("mode", ["vpp", "vpp-async", "vpp-stream"])
def test_fused_fold_equals_reference_on_two_ranks(pool2, matches_reference, mode):
    # The fold rank runs stages P-1 and P as one forward (schedule/layout.py, [Note: fused fold]).
    result = pool2.run(_spec(mode, 2, [192, 96, 64], 32, fold="fused"))
    assert [s.num_layers for s in result.spec.layout(8).stages] == [2, 4, 2]
    assert matches_reference(result) == 0.0


def test_fused_fold_equals_reference_on_three_ranks(pool3, matches_reference):
    result = pool3.run(_spec("vpp-pack", 3, [200, 90], 40, num_layers=6, fold="fused"))
    assert result.spec.layout(6).num_stages == 5
    assert matches_reference(result) == 0.0


@pytest.mark.parametrize("ranks", [2, 4])
def test_vpp_taper_equals_reference(pool2, pool4, matches_reference, ranks):
    # Chunk 128 tapers to 64-token first and last chunks: ramped chunking. Exact against the
    # same-chunk reference (== 0.0); against the whole-prompt forward only fp32 rounding, which
    # the extra chunks' accumulation order pushes to ~2e-5.
    result = (pool2 if ranks == 2 else pool4).run(_spec("vpp-taper", ranks, [1000, 300], 128))
    assert matches_reference(result, tol=1e-4) == 0.0


@pytest.mark.parametrize("model,mode", [
    ("tiny-qwen3-moe", "vpp-pack"), ("tiny-qwen3-moe", "cpp"),
    ("tiny-deepseek", "vpp-async"), ("tiny-deepseek", "dcpp"), ("tiny-llama", "vpp"),
])
def test_other_architectures(pool2, matches_reference, model, mode):
    result = pool2.run(_spec(mode, 2, [130, 60], 32, model=model))
    assert matches_reference(result) == 0.0


def test_local_hf_directory(pool2, matches_reference):
    tiny_hf = pytest.importorskip("sglang_vpp.models.tiny_hf")
    path = tiny_hf.cached_tiny_model(tiny_hf.TinyModelSpec("qwen3-tiny", num_layers=4))
    result = pool2.run(_spec("vpp-pack", 2, [100, 40], 32, model=str(path)))
    assert matches_reference(result) == 0.0


@pytest.mark.parametrize("mode", ["cpp", "vpp-pack"])
def test_request_arriving_while_another_runs(pool2, matches_reference, mode):
    """Request 1 arrives 0.05 s into a run of about a second; the online planner takes it in mid-flight."""
    spec = _spec(mode, 2, [3072, 64], 64, arrivals=[0.0, 0.05])
    result = pool2.run(spec)
    assert matches_reference(result) == 0.0
    head = result.reports[0]
    assert head.arrivals_s == [0.0, 0.05]
    first = min(r.start_s for r in head.records if r.is_compute and r.request_index == 1)
    assert first >= 0.05, "request 1 ran before it arrived"
    last_stage = spec.layout(8).last_stage
    finish_0 = max(r.end_s for rep in result.reports for r in rep.records
                   if r.is_compute and r.request_index == 0 and r.stage_index == last_stage)
    assert first < finish_0, "request 1 waited for request 0 to leave the pipeline"


def test_measurement_and_replay(pool2):
    spec = _spec("vpp-async", 2, [256, 128], 32)
    result = pool2.run(spec)
    layout = spec.layout(8)
    measured = measure_run(result.reports, layout.last_stage)
    for stats in measured.per_rank:  # the three parts tile the makespan
        assert stats.compute_s + stats.exposed_comm_s + stats.bubble_s == pytest.approx(measured.makespan_s)
        assert stats.compute_s > 0
    assert set(measured.request_ttft_s) == {0, 1}
    replay = replay_run(spec, layout, result.reports)
    validate_schedule(replay.schedule)
    assert [[str(a) for a in actions] for actions in replay.schedule.rank_actions] == [r.executed for r in result.reports]
    sim = replay.result
    assert sim.ok and sim.makespan_s > 0
    # The replay charges each compute exactly its measured CPU cost.
    measured_cost = {r: sum(x.cost_s for x in rep.records if x.is_compute) for r, rep in enumerate(result.reports)}
    for stats in sim.per_rank:
        assert stats.compute_s == pytest.approx(measured_cost[stats.rank])
    assert sim.makespan_s >= max(measured_cost.values())
    computes = [s for s in replay.samples if s.kind == "compute"]
    assert len(computes) == sum(1 for rep in result.reports for r in rep.records if r.is_compute)
    assert all(s.num_layers == 2 for s in computes)  # fold-back, 8 layers on 4 stages


@pytest.mark.parametrize("model,mode", [
    ("tiny-qwen3", "cpp"), ("tiny-qwen3", "vpp"), ("tiny-qwen3", "vpp-pack"),
    ("tiny-deepseek", "vpp-async"), ("tiny-qwen3-moe", "dcpp"),
])
def test_batched_short_requests_equal_reference(pool2, matches_reference, model, mode):
    """Whole short requests share a forward (attention per request), as SGLang batches them
    (``test_partial_fill_equals_reference``: with the head of the next one in what is left)."""
    result = pool2.run(_spec(mode, 2, [20, 30, 17, 100, 12, 9], 64, model=model, batch_requests=True,
                             partial_fill=False))
    assert matches_reference(result) == 0.0
    assert any(row[5] for row in result.reports[0].chunks), "no forward carried several requests"
    assert sorted(result.outputs) == list(range(6))
    # Each compute sample names every request of its forward, and together they are its tokens.
    forwards = {(r.stage_index, r.request_index, r.chunk_index): r.num_tokens
                for report in result.reports for r in report.records if r.is_compute}
    layers = resolve_model(model, 0, None).config.num_hidden_layers
    samples = [s for s in cost_samples(result.spec.layout(layers), result.reports) if s.kind == "compute"]
    assert any(s.batch for s in samples)
    assert all(s.total_tokens == forwards[s.key] for s in samples)


@pytest.mark.parametrize("model,mode", [
    ("tiny-qwen3", "cpp"), ("tiny-qwen3", "vpp-stream"), ("tiny-deepseek", "vpp-pack"),
])
def test_partial_fill_equals_reference(pool2, matches_reference, model, mode):
    """A request that overflows the budget starts in what is left (a head in the batch, its rest
    the request's next forwards), as SGLang's prefill adder fills a batch: the head's KV carries
    over to the rest on every stage, a long prompt's (150 tokens: a head, then chunks of 64 from
    its end) as a short one's."""
    lengths = [20, 30, 150, 17, 100, 12, 9, 40]
    result = pool2.run(_spec(mode, 2, lengths, 64, model=model, batch_requests=True, partial_fill=True))
    assert matches_reference(result) == 0.0
    chunks = result.reports[0].chunks
    heads = [part for row in chunks for part in row[5] if not part.is_last]
    assert heads and all(part.chunk_index == 0 and part.start == 0 for part in heads)
    assert any(lengths[h.request_index] > 64 for h in heads), "no long prompt started in a leftover"
    rests = {(row[0], row[1]): row for row in chunks}
    assert all((h.request_index, 1) in rests and rests[(h.request_index, 1)][2] == h.num_tokens for h in heads)
    assert all(row[3] + sum(part.num_tokens for part in row[5]) <= 64 for row in chunks)
    assert sorted(result.outputs) == list(range(len(lengths)))
    # A head's request has its first token when its rest leaves the last stage, not its head.
    layout = result.spec.layout(resolve_model(model, 0, None).config.num_hidden_layers)
    measured = measure_run(result.reports, layout.last_stage)
    last = {(r.request_index, r.chunk_index): r.end_s for report in result.reports for r in report.records
            if r.is_compute and r.stage_index == layout.last_stage}
    arrivals = result.reports[0].arrivals_s
    for head in heads:
        final = max(index for request, index in rests if request == head.request_index)
        rest_end = last[(head.request_index, final)]
        assert measured.request_ttft_s[head.request_index] == pytest.approx(rest_end - arrivals[head.request_index])
