"""Start real SGLang servers from Python: on 127.0.0.1, wait for health, always kill the tree.

Used by ``sglang-vpp bench-serve --launch`` and by the test harness (tests/sglang/).

Data flow::

    ServerConfig (model dir, pp size, mode, platform flags, extra flags)
      -> SGLangServer.start(): python -m sglang.launch_server ... in a new session
         (stdout+stderr -> log file), poll GET /health until 200, the process dies, or timeout
      -> clients talk HTTP to server.url
      -> SGLangServer.stop(): SIGTERM to the whole process group, SIGKILL after a grace period,
         then SIGKILL to any descendant that left the group (never a process we did not start)
      -> if the starting process dies without stop() (SIGKILL, os._exit), Linux kills the
         launcher (PR_SET_PDEATHSIG) and SGLang's own processes follow their parent

ServerPool keeps at most one server alive (small machines): asking for another config stops the
current one first.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..parent_death import die_with_parent

__all__ = [
    "CPU_PLATFORM_ARGS",
    "ServerConfig",
    "ServerPool",
    "SGLangServer",
    "ServerStartError",
    "free_port",
    "get_json",
    "post_json",
]

CPU_PLATFORM_ARGS: tuple[str, ...] = (
    "--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32", "--sleep-on-idle",
)  # fmt: skip
"""SGLang on CPU: the portable attention backend, and fp32 so outputs compare with the reference.
``--sleep-on-idle``: an idle stock scheduler otherwise loops without pause, and at pp > 1 its
followers loop with it, one core each; on a host of a few cores that starves whatever runs beside
it (a PD decode server idles while prefill servers start, a test computes its reference next to an
idle server). It waits on its input sockets only when it holds no request at all (SGLang's
``is_fully_idle``, PD transfer queues included), so a request wakes it at once. The VPP loop has
its own idle wait and does not read the flag."""


HEALTH_POLL_S = 0.25
"""Between two GET /health during start-up: a start costs tens of seconds, a probe almost nothing."""


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy; the message carries the log tail."""


class _PortTaken(ServerStartError):
    """Another process bound the port between ``free_port()`` and the server's bind."""


PORT_FLOOR = 20000
"""Lowest port ``free_port`` offers: above the well-known and registered services' usual ports."""

MIN_PORT_SPAN = 1000
"""Fewer ports than this between ``PORT_FLOOR`` and the ephemeral range: the kernel picks instead."""

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

_port_choice = random.Random()
"""Its own generator: a test that seeds ``random`` must not make every run pick the same ports."""


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel gives a client socket as its own (Linux's default where unreadable)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, below the ephemeral range.

    A port from the ephemeral range can be the source port the kernel gives our own health
    probe; probing it before the server listens then connects the probe to itself (a TCP
    self-connect), which reads its own request back as the answer and holds the port the server
    is about to bind. Below the range no client socket can take the port."""
    low, _ = ephemeral_port_range()
    if low - PORT_FLOOR >= MIN_PORT_SPAN:
        for _ in range(64):
            port = _port_choice.randrange(PORT_FLOOR, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post_json(url: str, payload: dict[str, Any], timeout: float = 300.0) -> Any:
    """POST JSON, return the decoded JSON answer (raises on HTTP errors, with the body)."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"POST {url} -> {exc.code}: {exc.read()[:2000]!r}") from exc


def get_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass(frozen=True)
class ServerConfig:
    """One server launch. Frozen, so it can key the pool."""

    model_dir: str
    pp_size: int = 1
    pp_mode: str | None = None
    """``--pp-mode``; None leaves the flag out (stock command line)."""
    chunked_prefill_size: int | str | None = 64
    """``--chunked-prefill-size``: tokens, or "auto" (vpp modes)."""
    max_total_tokens: int = 16384
    extra_args: tuple[str, ...] = ()
    platform_args: tuple[str, ...] = CPU_PLATFORM_ARGS
    """Device flags; the default runs on CPU (``CPU_PLATFORM_ARGS``)."""
    extra_env: tuple[tuple[str, str], ...] = ()

    def command(self, port: int) -> list[str]:
        cmd = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_dir,
            "--host", "127.0.0.1", "--port", str(port),
            *self.platform_args,
            "--max-total-tokens", str(self.max_total_tokens),
            "--pp-size", str(self.pp_size),
        ]  # fmt: skip
        if self.chunked_prefill_size is not None:
            cmd += ["--chunked-prefill-size", str(self.chunked_prefill_size)]
        if self.pp_mode is not None:
            cmd += ["--pp-mode", self.pp_mode]
        return cmd + list(self.extra_args)

    @property
    def on_cpu(self) -> bool:
        args = list(self.platform_args) + list(self.extra_args)
        return any(a == "--device" and b == "cpu" for a, b in zip(args, args[1:]))

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.pp_size > 1 and self.on_cpu:
            # SGLang on CPU needs one core list per rank; share the machine's cores round-robin.
            num_cpus = os.cpu_count() or 1
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(
                str(rank % num_cpus) for rank in range(self.pp_size)
            )
        env.update(dict(self.extra_env))
        return env


@dataclass
class SGLangServer:
    """One running ``sglang.launch_server`` process tree."""

    config: ServerConfig
    log_path: Path
    port: int = 0
    process: subprocess.Popen | None = None
    start_seconds: float = 0.0
    _descendants: dict[int, Any] = field(default_factory=dict)
    """pid -> psutil.Process; psutil refuses to signal a reused pid (it checks create time)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, num_chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 240.0,
              on_wait: Callable[[float, str], None] | None = None) -> SGLangServer:
        """Start and wait until healthy. ``port`` 0 picks a free one; ``on_wait(elapsed_s,
        last_log_line)`` is called about once a second while the server starts. Call it from a
        thread that lives as long as the server: on Linux the server is killed when it ends."""
        chosen = not self.port
        began = time.monotonic()
        for attempt in (1, 2):
            self.port = self.port or free_port()
            self._spawn()
            try:
                self._wait_healthy(began + timeout, on_wait)
                break
            except _PortTaken:
                # free_port() only saw the port free; on a shared host another process may bind it
                # first, and SGLang then hangs instead of exiting. A port we chose: choose again.
                self.stop()
                if not chosen or attempt == 2:
                    raise
                self.port = 0
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - began
        return self

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child, closed below
        self.process = subprocess.Popen(
            self.config.command(self.port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.config.env(),
            start_new_session=True,
            preexec_fn=die_with_parent,  # no server outlives the thread that owns it
        )
        log.close()
        atexit.register(self.stop)

    def _wait_healthy(self, deadline: float, on_wait: Callable[[float, str], None] | None = None) -> None:
        assert self.process is not None
        began = time.monotonic()
        next_report = began
        while time.monotonic() < deadline:
            if on_wait is not None and time.monotonic() >= next_report:
                next_report += 1.0
                lines = self.log_tail(2000).strip().splitlines()
                on_wait(time.monotonic() - began, lines[-1] if lines else "")
            self._remember_descendants(self.process.pid)
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"sglang server exited with {self.process.returncode} during start-up "
                    f"({' '.join(self.config.command(self.port))}); log tail:\n{self.log_tail()}"
                )
            if "error while attempting to bind on address" in self.log_tail(2000):
                raise _PortTaken(
                    f"port {self.port} was taken by another process before the server bound it; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (OSError, http.client.HTTPException):  # URLError, refused and timed out are OSErrors
                pass  # not listening yet, or not yet speaking HTTP
            time.sleep(HEALTH_POLL_S)
        raise ServerStartError(
            f"sglang server not healthy after the start-up timeout; log tail:\n{self.log_tail()}"
        )

    def _remember_descendants(self, pid: int) -> None:
        try:
            import psutil

            parent = psutil.Process(pid)
            for child in parent.children(recursive=True):
                self._descendants.setdefault(child.pid, child)
        except Exception:  # noqa: BLE001 - best effort bookkeeping for stop()
            pass

    def stop(self, grace: float = 10.0) -> None:
        """Kill the whole tree: SIGTERM the group, SIGKILL after ``grace`` seconds. Idempotent."""
        process, self.process = self.process, None
        if process is None:
            return
        self._remember_descendants(process.pid)
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)
        for child in self._descendants.values():  # children that left the process group, if any
            try:
                if child.is_running():
                    child.kill()
            except Exception:  # noqa: BLE001 - already gone or not ours any more
                pass


@dataclass
class ServerPool:
    """At most one live server; ``get`` reuses it for the same config or replaces it."""

    log_dir: Path
    current: SGLangServer | None = None
    started: list[SGLangServer] = field(default_factory=list)

    def get(self, config: ServerConfig, timeout: float = 240.0) -> SGLangServer:
        if self.current is not None and self.current.config == config:
            if self.current.process is not None and self.current.process.poll() is None:
                return self.current
        self.close()
        name = f"server-{len(self.started)}-pp{config.pp_size}-{config.pp_mode or 'stock'}.log"
        server = SGLangServer(config, self.log_dir / name)
        self.started.append(server)
        server.start(timeout=timeout)
        self.current = server
        return server

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
