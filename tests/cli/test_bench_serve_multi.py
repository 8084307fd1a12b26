"""bench-serve against several servers at once (stand-in HTTP servers on 127.0.0.1)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app


def _fake_server(num_tokens: int):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = len(body.get("input_ids") or [])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(1, num_tokens + 1):
                event = {"text": "x" * i, "meta_info": {"completion_tokens": i, "prompt_tokens": prompt}}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def two_servers():
    servers = [_fake_server(3), _fake_server(5)]
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_side_by_side(tmp_path, two_servers):
    out, lines = tmp_path / "runs.json", tmp_path / "results.jsonl"
    args = ["bench-serve", "--url", f"cpp={two_servers[0]}", "--url", f"vpp-pack={two_servers[1]}",
            "--workload", "short", "--num-requests", "4", "--input-len", "16", "--output-len", "4",
            "--no-progress", "--json", str(out), "--output-file", str(lines), "--plot", str(tmp_path / "times.png")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "times.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert CliRunner().invoke(app, args).exit_code == 0  # appends
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["label"] for r in records] == ["cpp", "vpp-pack"] * 2
    assert all(len(r["ttfts"]) == 4 and "sglang_version" in r["tags"] for r in records)
    assert "side by side" in result.output and "vpp-pack" in result.output
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["cpp", "vpp-pack"]
    assert [r["summary"]["output_tokens"] for r in runs] == [12, 20]
    assert runs[0]["config"] == runs[1]["config"]  # the same workload for both


def test_single_url_keeps_flat_json(tmp_path, two_servers):
    out = tmp_path / "one.json"
    result = CliRunner().invoke(app, ["bench-serve", "--url", two_servers[0], "--num-requests", "2",
                                      "--input-len", "8", "--no-progress", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["url"] == two_servers[0] and data["summary"]["num_failed"] == 0


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
