"""``sglang-vpp bench-serve``: workload and statistics units, and a run against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, free_port

from sglang_vpp.cli.bench_serve_cmd import (
    BenchServeError,
    RequestResult,
    Stats,
    Workload,
    make_workload,
    summarize,
)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench-serve", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "240"},
    )  # fmt: skip


def test_stats_percentiles_are_exact_on_a_known_list():
    stats = Stats.of([float(v) for v in range(1, 11)])  # 1..10
    assert (stats.min, stats.median, stats.max) == (1.0, 5.5, 10.0)
    assert stats.p90 == pytest.approx(9.1)  # linear interpolation, like numpy's default
    assert Stats.of([]) is None
    assert Stats.of([2.0]).p90 == 2.0


def test_workloads_are_deterministic_and_shaped():
    long_a = make_workload(Workload.LONG, 3, 100, 4, seed=7)
    long_b = make_workload(Workload.LONG, 3, 100, 4, seed=7)
    assert long_a == long_b and [r.input_len for r in long_a] == [100, 100, 100]
    assert make_workload(Workload.LONG, 3, 100, 4, seed=8) != long_a
    mixed = make_workload(Workload.MIXED, 400, 1000, 4, seed=0, max_input_len=20000)
    lengths = sorted(r.input_len for r in mixed)
    assert 7 <= lengths[0] and lengths[-1] <= 20000
    median, p90 = lengths[200], lengths[360]
    assert 700 < median < 1400 and 4 < p90 / median < 9  # p90/median = 6.4 by construction
    assert all(max(r.input_ids) < 10000 for r in mixed)


def test_file_workload_reads_each_form(tmp_path: Path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"input_len": 5}\n{"input_ids": [11, 12, 13], "output_len": 2}\n\n{"text": "hi"}\n'
                    '# the format simulate reads:\n{"length": 7, "arrival": 0.5}\n')
    requests = make_workload(Workload.FILE, 0, 0, 8, file=path)
    assert [r.input_len for r in requests] == [5, 3, None, 7]
    assert [r.output_len for r in requests] == [8, 2, 8, 8]
    assert requests[2].payload()["text"] == "hi" and requests[2].payload()["stream"] is True
    path.write_text('{"tokens": 5}\n')
    with pytest.raises(BenchServeError, match="w.jsonl:1: needs one of length, input_len"):
        make_workload(Workload.FILE, 0, 0, 8, file=path)


def test_summary_counts_only_successful_requests():
    results = [
        RequestResult(0, ok=True, ttft=0.5, latency=1.5, input_tokens=100, output_tokens=11),
        RequestResult(1, ok=False, error="HTTP 500"),
    ]
    summary = summarize(results, wall=2.0)
    assert summary.num_failed == 1 and summary.input_tokens == 100
    assert summary.time_per_output_token.median == pytest.approx(0.1)
    assert summary.total_throughput == pytest.approx(111 / 2.0)
    assert summary.errors == ["HTTP 500"]


def test_unreachable_server_is_a_clear_error():
    done = _cli("--url", f"http://127.0.0.1:{free_port()}", "--num-requests", "1", "--timeout", "5")
    assert done.returncode == 2
    assert "warm-up request" in done.stderr and "is the server up?" in done.stderr


@pytest.mark.slow
@pytest.mark.sglang
@SKIP_NO_SGLANG
@pytest.mark.parametrize("workload", ["short", "mixed"])
def test_bench_serve_reports_ttft_of_a_real_cpu_server(workload, server_pool, tiny_model_dir, tmp_path):
    # Same config as test_server_generate's "pp1" case: the pool reuses the running server.
    server = server_pool.get(ServerConfig(model_dir=str(tiny_model_dir), chunked_prefill_size=64))
    out = tmp_path / "bench.json"
    done = _cli(
        "--url", server.url, "--workload", workload, "--num-requests", "4", "--input-len", "96",
        "--output-len", "5", "--concurrency", "2", "--label", "pp1", "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TTFT" in done.stdout and "4/4 ok" in done.stdout
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["num_failed"] == 0 and summary["ttft"]["count"] == 4
    ttft, latency = summary["ttft"], summary["latency"]
    assert 0 < ttft["min"] <= ttft["median"] <= ttft["p90"] <= ttft["max"]
    assert latency["min"] >= ttft["min"]
    assert summary["output_tokens"] == 4 * 5
    assert summary["input_tokens"] == sum(report["config"]["input_lens"])
    assert report["server"]["pp_size"] == 1 and report["label"] == "pp1"
    assert all(r["ttft"] <= r["latency"] for r in report["requests"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "either --url"),
        (("--url", "http://127.0.0.1:1", "--launch", "cpp"), "not both"),
        (("--launch", "cpp,zpp"), "unknown mode(s) ['zpp']"),
        (("--launch", "cpp,cpp"), "names a mode twice"),
        (("--launch", "cpp", "--model-path", "/nonexistent", "--repeats", "0"), "--repeats must be >= 1"),
        (("--launch", "vpp", "--model-path", "/nonexistent", "--chunked-prefill-size", "0"), "--chunked-prefill-size"),
    ],
)
def test_launch_option_errors_name_the_value(args, message):
    done = _cli(*args, "--no-progress")
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr


@pytest.mark.slow
@pytest.mark.sglang
@SKIP_NO_SGLANG
def test_launch_runs_modes_side_by_side_with_per_rank_idle(server_pool, tiny_model, tmp_path):
    from sglang_vpp.models.tiny_hf import TinyModelSpec

    server_pool.close()  # bench-serve --launch starts its own servers, one at a time
    model = tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8))
    out, work = tmp_path / "launch.json", tmp_path / "work"
    first_port = free_port()
    done = _cli(
        "--launch", "cpp,vpp-pack", "--model-path", str(model), "--pp-size", "2", "--chunked-prefill-size", "64",
        "--workload", "long", "--num-requests", "1", "--input-len", "768", "--output-len", "2", "--repeats", "2",
        "--work-dir", str(work), "--json", str(out), "--no-progress", "--port", str(first_port),
        "--output-file", str(tmp_path / "results.jsonl"), "--plot", str(tmp_path / "times.png"), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "prefill idle per rank" in done.stdout and "not a wall-clock measurement" in done.stdout
    assert "replayed makespan s" in done.stdout
    assert "verdict (replayed prefill makespan): " in done.stdout and "vpp-pack vs cpp: " in done.stdout
    report = json.loads(out.read_text())
    runs = {run["label"]: run for run in report["runs"]}
    assert list(runs) == ["cpp", "vpp-pack"]
    assert [runs[m]["url"] for m in runs] == [f"http://127.0.0.1:{first_port + i}" for i in range(2)]
    comparison = report["verdicts"][0]["comparisons"][0]
    assert (comparison["mode"], comparison["baseline"]) == ("vpp-pack", "cpp")
    assert comparison["outcome"] in ("faster", "slower", "no significant difference")
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(x["tags"]["pp_mode"], x["tags"]["pp_size"], x["tags"]["chunked_prefill_size"]) for x in lines] == [
        ("cpp", 2, 64), ("vpp-pack", 2, 64)]
    assert all(x["tags"]["sglang_version"] and len(x["ttfts"]) == 2 for x in lines)
    assert (tmp_path / "times.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for mode, num_stages in (("cpp", 2), ("vpp-pack", 4)):
        run = runs[mode]
        assert run["config"]["launch"]["mode"] == mode
        assert [r["num_failed"] for r in run["repeats"]] == [0, 0]
        assert run["summary"]["num_requests"] == 2 and run["summary"]["ttft"]["count"] == 2  # both repeats
        per_repeat = run["pipeline"]["per_repeat"]
        assert len(per_repeat) == 2
        for repeat in per_repeat:
            # 768 tokens in chunks of 64: 12 prefill micro-batches, one compute per stage each.
            assert repeat["num_micro_batches"] == 12, repeat
            assert repeat["num_prefill_computes"] == 12 * num_stages, repeat
            for rank in repeat["ranks"]:
                assert rank["busy_s"] > 0 and 0 <= rank["idle_s"] <= rank["makespan_s"]
        makespans = run["pipeline"]["replayed_makespan_s"]
        assert len(makespans) == 2 and all(m > 0 for m in makespans)
        min_cost = run["pipeline"]["min_cost"]  # same work in both repeats: comparable
        assert min_cost["num_prefill_computes"] == 12 * num_stages and "minimum" in min_cost["method"]
        spread = run["pipeline"]["idle_spread"]
        assert [r["rank"] for r in spread] == [0, 1]
        assert all(r["idle_s"]["min"] <= r["idle_s"]["median"] <= r["idle_s"]["max"] for r in spread)
    # Every launched server was stopped: nothing listens on their ports any more.
    for run in runs.values():
        with pytest.raises(OSError):
            import urllib.request

            urllib.request.urlopen(run["url"] + "/health", timeout=5)


@SKIP_NO_SGLANG
def test_launch_reports_a_server_that_cannot_start(tmp_path):
    bad_model = tmp_path / "not-a-model"
    bad_model.mkdir()
    done = _cli("--launch", "cpp", "--model-path", str(bad_model), "--pp-size", "1", "--num-requests", "1",
                "--startup-timeout", "120", "--work-dir", str(tmp_path / "work"), "--no-progress")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error: sglang server exited" in done.stderr and "Traceback" not in done.stderr.split("error:")[0]
