"""Workloads: the paper's shapes, seeded, and closed-loop clients executed causally."""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import LinearAttentionCost
from sglang_vpp.sim import WorkloadError
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.workloads import (
    build_workload,
    describe_lengths,
    file_workload,
    long_workload,
    mixed_lengths,
    short_workload,
)


def test_mixed_matches_the_paper_statistics():
    for seed in range(3):
        stats = describe_lengths(mixed_lengths(500, seed))
        assert (stats["num_requests"], stats["min"], stats["max"]) == (500, 7, 122_710)
        assert 19_000 < stats["mean"] < 26_000
        assert 8_000 < stats["median"] < 12_500
        assert 52_000 < stats["p90"] < 76_000
    assert mixed_lengths(500, 1) == mixed_lengths(500, 1)
    assert mixed_lengths(500, 1) != mixed_lengths(500, 2)


def test_long_and_short_shapes():
    long = long_workload([1024, 2048], num_requests=2)
    assert [r.length for r in long.requests] == [1024, 1024, 2048, 2048] and long.concurrency == 1
    short = short_workload(4096, 100)
    assert len(short.requests) == 100 and short.concurrency == 100
    with pytest.raises(WorkloadError, match="valid: long, short, mixed, file"):
        build_workload("bursty")


def test_file_workload(tmp_path):
    path = tmp_path / "reqs.jsonl"
    path.write_text('{"length": 300, "arrival": 0.5}\n# comment\n\n{"input_len": 100}\n')
    work = file_workload(path)
    assert [(r.length, r.arrival) for r in work.requests] == [(100, 0.0), (300, 0.5)]
    path.write_text('{"tokens": 5}\n')
    with pytest.raises(WorkloadError, match="reqs.jsonl:1: no length"):
        file_workload(path)
    with pytest.raises(WorkloadError, match="does not exist"):
        file_workload(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("mode", ["cpp", "vpp-pack"])
def test_closed_loop_requests_start_after_a_completion(mode):
    cost = LinearAttentionCost(transfer_per_token=1e-7)
    work = long_workload([4096, 2048, 8192])
    result = run_mode(mode, work, cost, RunConfig(2, 1024), 8).sim
    finish = result.request_finish_s
    for request in (1, 2):
        starts = [s.start for s in result.timeline if s.request_index == request and s.kind == "compute"]
        assert min(starts) >= finish[request - 1] - 1e-12
        assert result.request_release_s[request] == pytest.approx(finish[request - 1])
    assert len(result.request_ttft_s) == 3


def test_mixed_workload_runs_every_mode():
    cost = LinearAttentionCost(transfer_per_token=1e-8)
    work = build_workload("mixed", num_requests=40, seed=3, concurrency=8)
    rows = {mode: run_mode(mode, work, cost, RunConfig(2, 8192), 16).sim for mode in ("cpp", "dcpp", "vpp-pack")}
    for sim in rows.values():
        assert sim.ok and len(sim.request_ttft_s) == 40 and sim.num_tokens == work.num_tokens


@pytest.mark.parametrize("kind, options, flag", [
    ("long", {"lengths": [1024], "path": "reqs.jsonl"}, "--file"),
    ("short", {"lengths": [1024], "path": "reqs.jsonl"}, "--file"),
    ("mixed", {"lengths": [65536]}, "--seq-len"),
    ("mixed", {"path": "reqs.jsonl"}, "--file"),
    ("file", {"path": "reqs.jsonl", "lengths": [5120]}, "--seq-len"),
    ("file", {"path": "reqs.jsonl", "num_requests": 7}, "--requests"),
    ("long", {"lengths": [1024], "seed": 0}, "--seed"),
    ("short", {"lengths": [1024], "seed": 3}, "--seed"),
    ("file", {"path": "reqs.jsonl", "seed": 1}, "--seed"),
])
def test_a_flag_the_workload_would_ignore_is_refused(kind, options, flag):
    with pytest.raises(WorkloadError, match=f"the {kind} workload does not read {flag}"):
        build_workload(kind, **options)


def test_the_workload_defaults_are_written_once_and_simulate_shows_them():
    """``build_workload``'s defaults, the workload functions' and ``simulate``'s help and default
    ``--seq-len`` read one constant per workload: a changed default changes the help with it."""
    import typer.main

    from sglang_vpp.cli.app import app
    from sglang_vpp.cli.simulate_cmd import DEFAULT_LONG_SEQ_LEN
    from sglang_vpp.schedule import parse_size
    from sglang_vpp.sim.workloads import CONCURRENCY_HELP, REQUESTS_HELP, build_workload, long, mixed, short

    built = build_workload("long", lengths=[1024])
    assert (len(built.requests), built.concurrency) == (long.DEFAULT_NUM_REQUESTS, long.DEFAULT_CONCURRENCY)
    assert len(build_workload("short", lengths=[1024]).requests) == short.DEFAULT_NUM_REQUESTS
    built = build_workload("mixed")
    assert (len(built.requests), built.concurrency) == (mixed.DEFAULT_NUM_REQUESTS, mixed.DEFAULT_CONCURRENCY)
    assert len(mixed.mixed_lengths()) == len(mixed.mixed_workload().requests) == mixed.DEFAULT_NUM_REQUESTS
    assert len(short.short_workload(1024).requests) == short.DEFAULT_NUM_REQUESTS
    assert parse_size(DEFAULT_LONG_SEQ_LEN) == long.DEFAULT_LENGTH
    for count in (long.DEFAULT_NUM_REQUESTS, short.DEFAULT_NUM_REQUESTS, mixed.DEFAULT_NUM_REQUESTS):
        assert str(count) in REQUESTS_HELP
    assert f"long {long.DEFAULT_CONCURRENCY}," in CONCURRENCY_HELP and f"mixed {mixed.DEFAULT_CONCURRENCY}," in CONCURRENCY_HELP
    params = {param.name: param for param in typer.main.get_command(app).commands["simulate"].params}
    assert params["requests"].help == REQUESTS_HELP and params["concurrency"].help == CONCURRENCY_HELP
    assert DEFAULT_LONG_SEQ_LEN in params["seq_len"].help


def test_a_bad_request_count_is_a_workload_error_from_every_builder():
    """The count rule is the schedule core's (``check_num_requests``); the workload builders
    refuse with their own error type, which callers of the simulator catch."""
    from sglang_vpp.sim.errors import WorkloadError
    from sglang_vpp.sim.workloads import build_workload, long_workload, short_workload

    for build in (lambda: short_workload(4096, 0), lambda: long_workload([4096], 0),
                  lambda: build_workload("short", lengths=[4096], num_requests=0)):
        with pytest.raises(WorkloadError, match="--requests must be >= 1, got 0"):
            build()
