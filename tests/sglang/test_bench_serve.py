"""``sglang-vpp bench-serve``: its bench_serving command line, summaries and tables, and runs against
real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, free_port

from sglang_vpp.serving.bench_serving import BenchServeError, LoadPlan, ServingPass, Workload, merge_passes
from sglang_vpp.serving.report import render_tables


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench-serve", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "240"},
    )  # fmt: skip


def test_load_plan_is_bench_servings_command_line(tmp_path: Path):
    plan = LoadPlan(Workload.LONG, num_requests=2, input_len=768, output_len=4, concurrency=1, seed=3, warmup=1,
                    tokenizer="/m", flush_cache=True, extra_args=("--disable-stream",), progress=False)
    argv = plan.argv("http://h:1", tmp_path / "o.jsonl", seed_offset=2)
    assert argv[1:3] == ["-m", "sglang.benchmark.serving"]
    flags = dict(zip(argv[3::1], argv[4::1]))
    assert flags["--dataset-name"] == "random-ids" and flags["--random-input-len"] == "768"
    assert flags["--random-range-ratio"] == "1.0" and flags["--seed"] == "5" and flags["--max-concurrency"] == "1"
    assert flags["--tokenizer"] == "/m" and "--flush-cache" in argv and "--output-details" in argv
    assert "--tokenize-prompt" in argv  # exact lengths: ids are sent as ids, not re-tokenized text
    assert argv[-1] == "--disable-stream" and "--request-rate" not in argv  # all at once by default
    mixed = LoadPlan(Workload.MIXED, 8, 1000, 4, 4).argv("http://h:1", tmp_path / "o.jsonl", seed_offset=0)
    assert mixed[mixed.index("--random-input-len") + 1] == "2000"
    with pytest.raises(BenchServeError, match="--dataset-path"):
        LoadPlan(Workload.SHORT, 1, 1, 1, 1, dataset_name="sharegpt").check()  # would download


def test_merge_passes_and_80_column_table():
    one = ServingPass({"duration": 2.0}, ttfts=[0.1, 0.3], itls=[[0.01, 0.03], []], input_lens=[10, 10],
                      output_lens=[3, 1], errors=["", "boom\nHTTP 500"])
    summary = merge_passes([one, one])
    assert (summary["num_requests"], summary["num_failed"]) == (4, 2)
    assert summary["ttft_ms"]["median"] == pytest.approx(100.0) and summary["itl_ms"]["count"] == 4
    assert summary["itl_ms"]["mean"] == pytest.approx(20.0) and summary["e2e_ms"]["median"] == pytest.approx(140.0)
    assert summary["output_tokens"] == 6 and summary["output_throughput"] == pytest.approx(6 / 4.0)
    assert summary["errors"] == ["HTTP 500"]
    pipeline = {"equal_cost": {"makespan_s": [0.7, 0.8], "idle_fraction": [{"median": 0.1}, {"median": 0.3}]}}
    runs = [{"label": m, "url": "http://h", "summary": summary, "pipeline": pipeline} for m in ("cpp", "vpp-pack")]
    text = render_tables(runs)
    assert "bench-serve [cpp, vpp-pack]: served times" in text and "prefill pipeline per rank" in text
    assert "0.750 [0.700-0.800]" in text and "r1 30%" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "| vpp-pack |" in render_tables(runs, "md")
    every = [{**runs[0], "label": m} for m in ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-taper")]
    text = render_tables(every)  # --launch all: the titles name six modes
    assert max(len(line) for line in text.splitlines()) <= 80 and "vpp-taper]: prefill" in text


def test_unreachable_server_is_a_clear_error():
    done = _cli("--url", f"http://127.0.0.1:{free_port()}", "--num-requests", "1", "--timeout", "5")
    assert done.returncode == 2
    assert "does not answer" in done.stderr and "is the server up?" in done.stderr


@pytest.mark.slow
@pytest.mark.sglang
@SKIP_NO_SGLANG
def test_bench_serve_reports_ttft_of_a_real_cpu_server(server_pool, tiny_model_dir, tmp_path):
    # Same config as test_server_generate's "pp1" case: the pool reuses the running server.
    server = server_pool.get(ServerConfig(model_dir=str(tiny_model_dir), chunked_prefill_size=64))
    out = tmp_path / "bench.json"
    done = _cli(
        "--url", server.url, "--workload", "mixed", "--num-requests", "4", "--input-len", "96",
        "--output-len", "5", "--concurrency", "2", "--label", "pp1", "--json", str(out), "--no-progress",
        "--work-dir", str(tmp_path / "work"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bench-serve [pp1]: served times" in done.stdout and "4/4" in done.stdout
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert summary["num_failed"] == 0 and summary["ttft_ms"]["count"] == 4
    # 5 output tokens: at most 4 gaps each (a streamed chunk with k tokens counts k equal gaps, and
    # bench_serving skips chunks whose text is empty, as a byte-level tokenizer's can be).
    assert 0 < summary["itl_ms"]["count"] <= 4 * 4
    assert 0 < summary["ttft_ms"]["median"] <= summary["ttft_ms"]["p99"] <= summary["e2e_ms"]["p99"]
    # bench_serving counts a request's tokens up to its last chunk with text (a byte-level
    # tokenizer's last tokens can decode to nothing): at most what was asked for.
    assert 0 < summary["output_tokens"] <= 4 * 5
    assert report["repeats"][0]["server_info"]["pp_size"] == 1 and report["label"] == "pp1"
    assert report["repeats"][0]["max_concurrency"] == 2  # bench_serving's own record of the load


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "either --url"),
        (("--url", "http://127.0.0.1:1", "--launch", "cpp"), "not both"),
        (("--launch", "cpp,zpp"), "unknown mode(s) zpp;"),
        (("--launch", "cpp,cpp"), "names a mode twice"),
        (("--launch", "cpp", "--model-path", "/nonexistent", "--repeats", "0"), "--repeats must be >= 1"),
        (("--launch", "vpp", "--model-path", "/nonexistent", "--chunked-prefill-size", "0"), "--chunked-prefill-size"),
        (("--url", "http://127.0.0.1:1", "--pd"), "--pd starts a prefill-decode split per mode"),
    ],
)
def test_launch_option_errors_name_the_value(args, message):
    done = _cli(*args, "--no-progress")
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr


@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.timeout(900)  # two server starts and six bench_serving passes; the CLI's own limit is 900 s
@SKIP_NO_SGLANG
def test_launch_runs_modes_side_by_side_with_per_rank_idle(server_pool, tiny_model, tmp_path):
    from sglang_vpp.models.tiny_hf import TinyModelSpec

    server_pool.close()  # bench-serve --launch starts its own servers, one at a time
    model = tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8))
    out, work = tmp_path / "launch.json", tmp_path / "work"
    first_port = free_port()
    done = _cli(
        "--launch", "cpp,vpp-pack", "--model-path", str(model), "--pp-size", "2", "--chunked-prefill-size", "64",
        "--workload", "long", "--num-requests", "1", "--input-len", "384", "--output-len", "2", "--repeats", "2",
        "--work-dir", str(work), "--json", str(out), "--no-progress", "--port", str(first_port),
        "--output-file", str(tmp_path / "results.jsonl"), "--plot", str(tmp_path / "times.png"), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "bench-serve [cpp, vpp-pack]: prefill pipeline per rank" in done.stdout
    assert "equal-cost makespan s" in done.stdout and "ITL med" in done.stdout
    assert "verdict (equal-cost prefill makespan" in done.stdout and "vpp-pack vs cpp: " in done.stdout
    assert "significant: |median| >= 1%" in done.stdout and f"work dir (logs, traces, JSONL): {work}" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines() if not line.startswith(("wrote ", "work dir"))) <= 80
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
    for x in lines:  # bench_serving's own JSONL per mode is kept: one line per repeat
        own = [json.loads(line) for line in Path(x["bench_serving_jsonl"]).read_text().splitlines()]
        assert len(own) == 2 and all(len(o["ttfts"]) == 1 and len(o["itls"][0]) <= 1 for o in own)
    for png in ("times.png", "times-gantt.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for mode, num_stages in (("cpp", 2), ("vpp-pack", 4)):
        run = runs[mode]
        assert run["config"]["launch"]["mode"] == mode
        assert [r["completed"] for r in run["repeats"]] == [1, 1]
        assert run["summary"]["num_requests"] == 2 and run["summary"]["ttft_ms"]["count"] == 2  # both repeats
        per_repeat = run["pipeline"]["per_repeat"]
        assert len(per_repeat) == 2
        for repeat in per_repeat:
            # 384 tokens in chunks of 64: 6 prefill micro-batches, one compute per stage each (the
            # warm-up's 6 excluded).
            assert repeat["num_micro_batches"] == 6, repeat
            assert repeat["num_prefill_computes"] == 6 * num_stages, repeat
            for rank in repeat["ranks"]:
                assert rank["busy_s"] > 0 and 0 <= rank["idle_s"] <= rank["makespan_s"]
        makespans = run["pipeline"]["replayed_makespan_s"]
        assert len(makespans) == 2 and all(m > 0 for m in makespans)
        shared = run["pipeline"]["equal_cost"]  # one cost model for both modes, per repeat
        assert len(shared["makespan_s"]) == 2 and all(m > 0 for m in shared["makespan_s"])
        assert "shared by all modes" in shared["method"]
        min_cost = run["pipeline"]["min_cost"]  # same work in both repeats: comparable
        assert min_cost["num_prefill_computes"] == 6 * num_stages and "minimum" in min_cost["method"]
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
