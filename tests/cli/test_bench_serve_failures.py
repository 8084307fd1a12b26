"""bench-serve counts what was not served as failed, refuses loads the server cannot take and
servers that share this host, and checks --launch options before any server starts. Stand-in
servers on 127.0.0.1 (``test_bench_serve_multi._fake_server``); no SGLang server starts here."""

import pytest
import typer
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.serving.bench_serving import _failures, local_targets

from test_bench_serve_multi import _fake_server


def _record(**fields):
    record = {"errors": ["", "", ""], "ttfts": [0.1, 0.1, 0.1], "itls": [[0.01] * 3] * 3,
              "generated_texts": ["abcd"] * 3, "output_lens": [4, 4, 4]}
    record.update(fields)
    return record


def test_a_request_with_an_error_or_no_token_is_a_failure_and_a_short_count_is_not():
    # bench_serving's view of a rejected streamed request: "success", TTFT 0, no text.
    rejected = _record(ttfts=[0.1, 0.0, 0.1], generated_texts=["abcd", "", "abcd"])
    assert [bool(e) for e in _failures(rejected, 4)] == [False, True, False]
    # A shorter count is served: bench_serving counts up to the last chunk with text, and a
    # byte-level tokenizer's last tokens can carry none.
    short = _record(output_lens=[4, 2, 4])
    assert _failures(short, 4) == ["", "", ""]
    # bench_serving lists one output length per request, 0 for a failed one.
    errored = _record(errors=["", "Bad Request: too long", ""], output_lens=[4, 0, 2])
    assert _failures(errored, 4) == ["", "Bad Request: too long", ""]


def _served(label, failed):
    return {"label": label, "url": f"http://x/{label}", "config": {}, "errors": [],
            "summary": {"num_requests": 4, "num_failed": failed, "duration_s": 1.0, "output_throughput": 1.0,
                        "ttft_ms": None, "itl_ms": None, "e2e_ms": None, "errors": ["no output"] * bool(failed)}}


def test_a_run_with_failed_requests_gets_no_verdict_and_exits_1_unless_allowed(capsys):
    from sglang_vpp.cli.bench_serve_report import finish
    from sglang_vpp.verdict import make_verdict

    runs = [_served("cpp", 0), _served("vpp-pack", 4)]
    verdict = make_verdict({"cpp": [1.0, 1.1, 1.0], "vpp-pack": [0.5, 0.5, 0.6]}, "x", paired=False)
    document = {"runs": runs, "verdicts": [verdict.to_dict()]}
    with pytest.raises(typer.Exit) as exit_info:
        finish(runs, document, [verdict], None, None, None, "table", [{}, {}])
    out = capsys.readouterr().out
    assert exit_info.value.exit_code == 1
    assert "FAILED (vpp-pack): 4 of 4 requests not served" in out and "0/4" in out
    assert "no verdict" in out and "verdict (x)" not in out and document["verdicts"] == []
    finish(runs, {"runs": runs}, [verdict], None, None, None, "table", [{}, {}], allow_failures=True)
    out = capsys.readouterr().out
    assert "verdict (x)" in out and "--allow-failures" in out


@pytest.mark.parametrize("fmt", ["table", "md", "json"])
def test_json_to_stdout_leaves_stdout_json_only(fmt, capsys, tmp_path):
    import json
    from pathlib import Path

    from sglang_vpp.cli.bench_serve_report import finish
    from sglang_vpp.verdict import make_verdict

    runs = [_served("cpp", 0), _served("vpp-pack", 0)]
    verdict = make_verdict({"cpp": [1.0, 1.1, 1.0], "vpp-pack": [0.5, 0.5, 0.6]}, "x", paired=False)
    document = {"runs": runs, "verdicts": [verdict.to_dict()]}
    finish(runs, document, [verdict], Path("-"), None, None, fmt, [{}, {}], work_dir=tmp_path)
    captured = capsys.readouterr()
    assert json.loads(captured.out) == document  # one document: no table, no second copy, no note
    if fmt != "json":
        assert "verdict (x)" in captured.err and "vpp-pack" in captured.err
    assert f"work dir (logs, traces, JSONL): {tmp_path}" in captured.err


@pytest.fixture
def model_dir():
    pytest.importorskip("sglang.benchmark.serving", reason="bench-serve runs SGLang's bench_serving")
    from sglang_vpp.models.tiny_hf import TinyModelSpec, cached_tiny_model

    return str(cached_tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8)))


def _serve(*servers):
    return [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]


def _stop(*servers):
    for server in servers:
        server.shutdown()
        server.server_close()


def test_prompts_longer_than_the_server_context_are_refused_before_any_load(model_dir):
    seen: list = []
    server = _fake_server(None, model_dir, seen, context_len=8192)
    try:
        result = CliRunner().invoke(app, ["bench-serve", "--url", _serve(server)[0], "--workload", "long",
                                          "--no-progress"])
    finally:
        _stop(server)
    assert result.exit_code == 2, result.output
    assert "8192 tokens plus 16 output tokens (8208) do not fit the server's context length 8192" in result.output
    assert "--input-len" in result.output and seen == []


@pytest.mark.slow  # one bench_serving pass, whose worker imports SGLang (about 10 s)
def test_rejected_requests_are_counted_failed_and_exit_1(model_dir, tmp_path):
    server = _fake_server(0, model_dir)
    try:
        result = CliRunner().invoke(app, ["bench-serve", "--url", _serve(server)[0], "--workload", "short",
                                          "--num-requests", "3", "--input-len", "16", "--output-len", "4",
                                          "--warmup", "0", "--no-progress", "--work-dir", str(tmp_path)])
    finally:
        _stop(server)
    assert result.exit_code == 1, result.output
    assert " 0/3 " in result.output and "FAILED" in result.output and "no token" in result.output


def test_servers_on_this_host_are_not_compared_without_allow_shared_host(model_dir):
    servers = [_fake_server(None, model_dir), _fake_server(None, model_dir)]
    urls = _serve(*servers)
    try:
        result = CliRunner().invoke(app, ["bench-serve", "--url", f"cpp={urls[0]}", "--url",
                                          f"vpp-pack={urls[1].replace('127.0.0.1', 'localhost')}", "--no-progress"])
    finally:
        _stop(*servers)
    assert result.exit_code == 2, result.output
    assert "cpp, vpp-pack: these servers run on this host at once" in result.output
    assert "--allow-shared-host" in result.output


def test_local_targets_finds_loopback_and_this_hosts_addresses():
    targets = [("a", "http://127.0.0.1:1"), ("b", "http://localhost:2"), ("c", "http://[::1]:3"),
               ("d", "http://192.0.2.7:4")]  # TEST-NET-1: never an address of this host
    assert local_targets(targets) == ["a", "b", "c"]


def test_launch_checks_the_plugin_and_the_device_before_any_server_starts(monkeypatch):
    pytest.importorskip("sglang.srt.server_args", reason="--launch needs SGLang")
    from sglang_vpp.serving.launcher import SGLangServer

    def no_start(*_args, **_kwargs):
        raise AssertionError("a server started")

    monkeypatch.setattr(SGLangServer, "start", no_start)
    result = CliRunner().invoke(app, ["bench-serve", "--launch", "cpp,vpp", "--pp-size", "1", "--no-progress"])
    assert result.exit_code == 2, result.output
    assert "--launch vpp: --pp-mode vpp needs pipeline parallelism but --pp-size is 1" in result.output
    # The docs' tiny model has an 8192-token context: --workload long's 8k prompts cannot fit.
    result = CliRunner().invoke(app, ["bench-serve", "--launch", "cpp", "--workload", "long", "--no-progress"])
    assert result.exit_code == 2 and "(8208) do not fit the server's context length 8192" in result.output
    import torch

    if not torch.cuda.is_available():
        result = CliRunner().invoke(app, ["bench-serve", "--launch", "cpp", "--device", "cuda", "--no-progress"])
        assert result.exit_code == 2 and "--device cuda needs" in result.output, result.output


def test_a_launch_refused_before_any_server_starts_leaves_no_new_work_dir(monkeypatch, tmp_path):
    pytest.importorskip("sglang.srt.server_args", reason="--launch needs SGLang")
    from sglang_vpp.serving.launcher import SGLangServer

    def no_start(*_args, **_kwargs):
        raise AssertionError("a server started")

    monkeypatch.setattr(SGLangServer, "start", no_start)
    work_dir = tmp_path / "new" / "work"
    # vpp at --pp-size 1 is refused by the plugin's argument check, after the flags' own checks.
    result = CliRunner().invoke(app, ["bench-serve", "--launch", "cpp,vpp", "--pp-size", "1", "--no-progress",
                                      "--work-dir", str(work_dir)])
    assert result.exit_code == 2, result.output
    assert "--pp-mode vpp needs pipeline parallelism but --pp-size is 1" in result.output
    assert list(tmp_path.iterdir()) == []


def test_bench_prints_a_progress_line_per_run_when_stderr_is_not_a_terminal(capsys):
    from sglang_vpp.cli.bench_cmd import _RichProgress
    from sglang_vpp.cli.progress import ProgressBars

    with ProgressBars(enabled=True) as bars:
        progress = _RichProgress(bars)
        progress.start(2)
        for repeat in range(2):
            progress.run_started("cpp", repeat)
            progress.run_finished("cpp", repeat, None)
        progress.phase("equal-cost replay")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("] ", 1)[1] for line in lines if "] " in line] == [
        "cpp repeat 1: done in 0.0 s (run 1 of 2)", "cpp repeat 2: done in 0.0 s (run 2 of 2)", "equal-cost replay"]
    assert all(line.startswith("[") and " s] " in line for line in lines if line.strip())
    with ProgressBars(enabled=False) as bars:  # --quiet
        _RichProgress(bars).phase("x")
    assert capsys.readouterr().err == ""


def test_a_url_without_v1_models_is_refused_at_once():
    """A 404 (another service, or a URL with a path) counted as up: bench_serving then waited 60 s."""
    import http.server
    import threading

    from sglang_vpp.serving.bench_serving import BenchServeError, check_reachable

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(BenchServeError, match=r"answers but has no /v1/models \(HTTP 404\)"):
            check_reachable(url)
    finally:
        server.shutdown()
        server.server_close()
