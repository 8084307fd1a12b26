"""bench-serve (SGLang's bench_serving underneath) against several servers at once: stand-in HTTP
servers on 127.0.0.1."""

import json
import threading
import time
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app


def _fake_server(num_tokens: int | None, model_dir: str, seen: list | None = None, context_len: int | None = None):
    """Answers what SGLang's bench_serving asks of an sglang backend: /v1/models (ready check, model
    id, context length), /model_info (tokenizer) and a streamed /generate of ``num_tokens`` tokens
    (None: as many as asked; 0: a rejection as SGLang streams it, an error event and no token);
    ``seen`` collects each /generate body with its arrival time."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self.path.endswith("/generate"):
                self.send_response(200)
                self.end_headers()
                return
            if seen is not None:
                seen.append((time.monotonic(), body))
            prompt = len(body.get("input_ids") or [])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if num_tokens == 0:
                error = {"error": {"message": "The input is longer than the model's context length"}}
                self.wfile.write(f"data: {json.dumps(error)}\n\n".encode())
            asked = body.get("sampling_params", {}).get("max_new_tokens", 1)
            for i in range(1, (asked if num_tokens is None else num_tokens) + 1):
                event = {"text": "x" * i, "meta_info": {"completion_tokens": i, "prompt_tokens": prompt}}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def do_GET(self):  # noqa: N802
            card = {"id": model_dir, **({"max_model_len": context_len} if context_len else {})}
            answers = {"/v1/models": {"data": [card]}, "/model_info": {"model_path": model_dir}}
            if self.path not in answers:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(answers[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def two_servers():
    pytest.importorskip("sglang.benchmark.serving", reason="bench-serve runs SGLang's bench_serving")
    from sglang_vpp.models.tiny_hf import TinyModelSpec, cached_tiny_model

    model_dir = str(cached_tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8)))
    servers = [_fake_server(3, model_dir), _fake_server(5, model_dir)]
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # the bench_serving worker imports SGLang once (about 10 s)
def test_side_by_side_runs_bench_serving(tmp_path, two_servers):
    out, lines, work = tmp_path / "runs.json", tmp_path / "results.jsonl", tmp_path / "work"
    args = ["bench-serve", "--url", f"cpp={two_servers[0]}", "--url", f"vpp-pack={two_servers[1]}",
            "--workload", "short", "--num-requests", "4", "--input-len", "16", "--output-len", "3",
            "--warmup", "0", "--no-progress", "--allow-shared-host", "--json", str(out), "--output-file", str(lines),
            "--work-dir", str(work), "--plot", str(tmp_path / "times.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "times.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["label"] for r in records] == ["cpp", "vpp-pack"]
    assert all(len(r["ttfts"]) == 4 and "sglang_version" in r["tags"] for r in records)
    # bench_serving's own JSONL per server is kept, with its per-request TTFT / ITL lists.
    for record, tokens in zip(records, (3, 5)):
        own = json.loads(Path(record["bench_serving_jsonl"]).read_text().splitlines()[-1])
        assert own["completed"] == 4 and len(own["ttfts"]) == 4
        assert [len(itl) for itl in own["itls"]] == [tokens - 1] * 4
    assert "bench-serve [cpp, vpp-pack]: served times" in result.output and "ITL med" in result.output
    assert max(len(line) for line in result.output.splitlines() if not line.startswith(("wrote ", "work dir"))) <= 80
    assert "note: shared host: cpp, vpp-pack ran on this host at once" in result.output
    assert f"work dir (logs, traces, JSONL): {work}" in result.output
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["cpp", "vpp-pack"]
    assert [r["summary"]["itl_ms"]["count"] for r in runs] == [4 * 2, 4 * 4]
    assert runs[0]["config"] == runs[1]["config"]  # the same load for both
    assert runs[0]["config"]["load_generator"].endswith("sglang.benchmark.serving")


@pytest.mark.parametrize("urls, fragment", [
    (["a=http://127.0.0.1:1", "a=http://127.0.0.1:2"], "distinct"),
    (["ftp://host"], "must look like"),
])
def test_bad_urls(urls, fragment):
    args = ["bench-serve", "--no-progress"] + [x for u in urls for x in ("--url", u)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and fragment in result.output


def test_launch_tags_read_the_server_arguments():
    from sglang_vpp.serving.results import launch_tags

    tags = launch_tags("vpp-pack", 2, 64, "cpu", ("--tp-size", "2", "--vpp-layer-split=2,2,2,2"))
    assert (tags["pp_mode"], tags["pp_size"], tags["tp_size"], tags["chunked_prefill_size"]) == ("vpp-pack", 2, 2, 64)
    assert tags["layer_split"] == [2, 2, 2, 2] and tags["device"] == "cpu"
    assert launch_tags("cpp", 2, 64, "cpu", ())["layer_split"] is None
    assert launch_tags("cpp", 2, 64, "cpu", ())["fold"] == "split"
    assert launch_tags("vpp-pack", 2, 64, "cpu", ("--vpp-fold=fused",))["fold"] == "fused"


def test_report_layouts_follow_the_servers_fold(tmp_path):
    """The equal-cost report re-times each mode's records on the layout its server ran: a fused
    fold's records put stage 2 on rank 0 at pp 2, which the split layout would refuse."""
    from types import SimpleNamespace

    from sglang_vpp.cli.bench_serve_report import _layouts
    from sglang_vpp.schedule import Fold

    (tmp_path / "config.json").write_text('{"num_hidden_layers": 8}')
    spec = SimpleNamespace(model_dir=str(tmp_path), pp_size=2, server_args=("--vpp-fold", "fused"))
    layouts = _layouts(["cpp", "vpp-pack"], spec)
    assert layouts["vpp-pack"].fold is Fold.FUSED and layouts["vpp-pack"].num_stages == 3
    assert layouts["cpp"].num_stages == 2  # no fold to fuse
    assert _layouts(["vpp-pack"], SimpleNamespace(model_dir=str(tmp_path), pp_size=2, server_args=()))["vpp-pack"].fold is Fold.SPLIT


@pytest.mark.slow  # one bench_serving pass, whose worker imports SGLang (about 10 s)
def test_workload_file_sends_each_request_at_its_length_and_arrival(tmp_path):
    """The file simulate reads is served as is: exact prompt lengths, per-request output lengths,
    and no request leaves before its arrival."""
    pytest.importorskip("sglang.benchmark.serving", reason="bench-serve runs SGLang's bench_serving")
    from sglang_vpp.models.tiny_hf import TinyModelSpec, cached_tiny_model

    model_dir = str(cached_tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8)))
    seen: list = []
    server = _fake_server(3, model_dir, seen)
    workload = tmp_path / "reqs.jsonl"
    workload.write_text('{"length": 37, "arrival": 0.0}\n# a note\n{"length": 5, "arrival": 1.5, "output_len": 2}\n'
                        '{"input_len": 130, "arrival": 0.75, "id": "x"}\n')
    try:
        result = CliRunner().invoke(app, [
            "bench-serve", "--url", f"http://127.0.0.1:{server.server_address[1]}", "--workload", "file",
            "--file", str(workload), "--output-len", "4", "--warmup", "0", "--no-progress",
            "--work-dir", str(tmp_path / "work"), "--json", str(tmp_path / "out.json")])
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0, result.output
    assert [len(body["input_ids"]) for _, body in seen] == [37, 130, 5]  # arrival order
    assert [body["sampling_params"]["max_new_tokens"] for _, body in seen] == [4, 4, 2]
    # Offsets from the first request's receipt, which a loaded host can delay by tens of ms: the
    # slack is a third of the gaps between arrivals, so a request sent early still fails.
    offsets = [t - seen[0][0] for t, _ in seen]
    slack = 0.25
    assert offsets[1] >= 0.75 - slack and offsets[2] >= 1.5 - slack and offsets[2] - offsets[1] >= 0.75 - slack
    config = json.loads((tmp_path / "out.json").read_text())["config"]
    assert config["workload_file"] == str(workload) and config["num_requests"] == 3
