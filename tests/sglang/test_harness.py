"""The server harness itself: healthy wait, start-up failure report, the tree kill, and no
server left behind when its owner dies without stopping it.

A fake server (plain Python: an HTTP /health endpoint plus a child in the process group and a
grandchild that left it with setsid) stands in for SGLang, so this runs in seconds.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from sglang_harness import ServerConfig, SGLangServer, ServerStartError, free_port

from sglang_vpp.serving import launcher as launcher_module

_HEALTH = """class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass"""
"""The fake servers' /health endpoint (SGLang answers 200 once it serves)."""

_FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys
    port = int(sys.argv[1])
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    subprocess.Popen(sleeper)                          # stays in the process group
    subprocess.Popen(sleeper, start_new_session=True)  # leaves it
    {health}
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
).replace("{health}", _HEALTH)


# Binds like uvicorn; a taken port gets uvicorn's error line, then it hangs as SGLang does.
_FAKE_BIND = textwrap.dedent(
    """
    import http.server, sys, time
    port = int(sys.argv[1])
    {health}
    try:
        server = http.server.HTTPServer(("127.0.0.1", port), Health)
    except OSError:
        print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
              "address already in use", flush=True)
        time.sleep(600)
    server.serve_forever()
    """
).replace("{health}", _HEALTH)


# Answers its first probes with their own request, as a probe that connected to itself reads.
_FAKE_ECHO = textwrap.dedent(
    """
    import http.server, socket, sys
    port = int(sys.argv[1])
    {health}
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    raw.bind(("127.0.0.1", port))
    raw.listen()
    for _ in range(3):
        conn, _ = raw.accept()
        conn.sendall(conn.recv(4096))
        conn.close()
    raw.close()
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
).replace("{health}", _HEALTH)


class FakeConfig(ServerConfig):
    def command(self, port: int) -> list[str]:
        if self.model_dir == "echo":
            return [sys.executable, "-c", _FAKE_ECHO, str(port)]
        if self.model_dir == "bind":
            return [sys.executable, "-c", _FAKE_BIND, str(port)]
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


def test_free_ports_lie_below_the_ephemeral_range():
    low, _ = launcher_module.ephemeral_port_range()
    if low - launcher_module.PORT_FLOOR < launcher_module.MIN_PORT_SPAN:
        pytest.skip(f"the ephemeral range starts at {low}: free_port() falls back to a kernel-chosen port")
    ports = {free_port() for _ in range(20)}
    assert all(launcher_module.PORT_FLOOR <= port < low for port in ports), ports
    assert len(ports) > 1


def test_an_answer_that_is_not_http_is_not_yet_healthy(tmp_path: Path):
    server = SGLangServer(FakeConfig(model_dir="echo"), tmp_path / "echo.log").start(timeout=60)
    try:
        assert server.process.poll() is None
    finally:
        server.stop(grace=2)


def test_a_port_taken_before_the_bind_is_retried_or_reported_at_once(tmp_path: Path, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # A port the caller gave: reported at once (the server would hang, not exit).
        began = time.monotonic()
        with pytest.raises(ServerStartError, match=f"port {port} was taken"):
            SGLangServer(FakeConfig(model_dir="bind"), tmp_path / "given.log", port=port).start(timeout=60)
        assert time.monotonic() - began < 30
        # A port free_port() chose: chosen again, and the second start serves.
        ports = iter([port, free_port()])
        monkeypatch.setattr(launcher_module, "free_port", lambda: next(ports))
        server = SGLangServer(FakeConfig(model_dir="bind"), tmp_path / "chosen.log").start(timeout=60)
        try:
            assert server.port != port and server.process.poll() is None
        finally:
            server.stop(grace=2)


_OWNER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from test_harness import FakeConfig
    from sglang_harness import SGLangServer
    server = SGLangServer(FakeConfig(model_dir="fake"), Path(sys.argv[2])).start(timeout=60)
    print(json.dumps({"launcher": server.process.pid}), flush=True)
    sys.stdin.read()  # until the test has seen the tree
    os._exit(1)  # what pytest-timeout's thread method does: no finalizer, no atexit
    """
)


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_server_dies_with_an_owner_that_exits_without_stopping_it(tmp_path: Path):
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(Path(__file__).parent), str(tmp_path / "owner.log")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    launcher = psutil.Process(json.loads(owner.stdout.readline())["launcher"])
    deadline = time.monotonic() + 20
    while len(launcher.children(recursive=True)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    fake_children = launcher.children(recursive=True)  # plain sleepers: only SGLang's die with it
    owner.stdin.close()
    owner.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _running(launcher) and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = _running(launcher)
    for process in [launcher, *fake_children]:
        if _running(process):
            process.kill()
    assert not survived, "the launcher outlived the process that started it"


def test_wait_for_json_fails_on_records_that_never_reach_the_state(tmp_path: Path):
    from sglang_harness import all_admitted_left, wait_for_json

    path = tmp_path / "vpp_rank0.records.json"
    busy = {"counters": {"num_packed": 0}, "decisions": [{"kind": "admit", "seq": 0}]}
    path.write_text(json.dumps(busy))
    with pytest.raises(AssertionError, match="did not reach the awaited state"):
        wait_for_json(path, timeout=1.0, until=all_admitted_left)
    idle = {**busy, "decisions": [*busy["decisions"], {"kind": "left", "seq": 0}]}
    path.write_text(json.dumps(idle))
    assert wait_for_json(path, timeout=1.0, until=all_admitted_left) == idle
    with pytest.raises(AssertionError, match="was not written"):
        wait_for_json(tmp_path / "missing.json", timeout=1.0)
