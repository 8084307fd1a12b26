"""The server harness itself: healthy wait, start-up failure report, and the tree kill.

A fake server (plain Python: an HTTP /health endpoint plus a child in the process group and a
grandchild that left it with setsid) stands in for SGLang, so this runs in seconds.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sglang_harness import ServerConfig, SGLangServer, ServerStartError

_FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys
    port = int(sys.argv[1])
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    subprocess.Popen(sleeper)                          # stays in the process group
    subprocess.Popen(sleeper, start_new_session=True)  # leaves it
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)


class FakeConfig(ServerConfig):
    def command(self, port: int) -> list[str]:
        if self.model_dir == "crash":
            return [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)"]
        return [sys.executable, "-c", _FAKE_SERVER, str(port)]


def test_stop_kills_the_whole_tree(tmp_path: Path):
    server = SGLangServer(FakeConfig(model_dir="fake"), tmp_path / "fake.log").start(timeout=60)
    launcher = psutil.Process(server.process.pid)
    deadline = time.monotonic() + 20
    while len(launcher.children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    tree = [launcher, *launcher.children(recursive=True)]
    assert len(tree) == 3
    server.stop(grace=2)
    time.sleep(0.5)
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"left running: {alive}"
    server.stop()  # idempotent


def test_start_failure_reports_the_log(tmp_path: Path):
    server = SGLangServer(FakeConfig(model_dir="crash"), tmp_path / "crash.log")
    with pytest.raises(ServerStartError, match="exited with 3 during start-up(.|\\n)*boom: bad flag"):
        server.start(timeout=60)
    assert server.process is None
