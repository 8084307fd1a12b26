"""A prefill-decode (PD) split on one host: one decode server, prefill servers in turn, SGLang's router.

Used by the PD tests (tests/sglang_pd/) and ``sglang-vpp bench-serve --launch ... --pd``.

Data flow::

    PdDeployment.start_decode(decode config)   python -m sglang.launch_server
        --disaggregation-mode decode ...        (SGLangServer, kept for the whole deployment)
    PdDeployment.serve_prefill(prefill config)  stops the previous prefill server and router,
        -> python -m sglang.launch_server --disaggregation-mode prefill
           --disaggregation-bootstrap-port B ...
        -> python -m sglang_router.launch_router --pd-disaggregation
           --prefill URL B --decode URL (its own session; log file)
        -> POST a one-token /generate through the router until it succeeds: the router
           registers its workers in the background and answers 503 until then
    clients -> router URL (/generate, bench_serving); the router posts each request to the
        prefill and the decode server with the bootstrap host/port/room; the prefill sends the
        KV over Mooncake (TCP on CPU) to the decode server, which decodes
    PdDeployment.restart_decode()               after a fault ended the decode server: a fresh
        one from the same config, and the router again for the live prefill server
    PdDeployment.stop()                         router, prefill, decode: every process tree

Each server gets its own ``--nccl-port`` (two servers on one host would otherwise pick the same).
"""

from __future__ import annotations

import atexit
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sglang_vpp.parent_death import die_with_parent
from sglang_vpp.serving.launcher import (
    ServerConfig,
    ServerStartError,
    SGLangServer,
    free_port,
    post_json,
)

__all__ = ["PD_TRANSFER_BACKEND", "PdDeployment", "RouterProcess", "decode_config", "prefill_config"]

PD_TRANSFER_BACKEND = "mooncake_tcp"
"""Mooncake with its TCP transport: the backend that runs without RDMA hardware."""

ROUTER_POLL_S = 0.25
"""Between two probe requests while the router registers its workers: it answers a refused probe
at once, and every router start (each prefill server, each decode restart) waits on it."""


def _pd_args(mode: str, bootstrap_port: int | None, backend: str) -> tuple[str, ...]:
    args = ("--disaggregation-mode", mode, "--disaggregation-transfer-backend", backend,
            "--nccl-port", str(free_port()))  # fmt: skip
    if bootstrap_port is not None:
        args += ("--disaggregation-bootstrap-port", str(bootstrap_port))
    return args


def decode_config(base: ServerConfig, backend: str = PD_TRANSFER_BACKEND) -> ServerConfig:
    """``base`` as a decode server (its pp size and TP flags are kept)."""
    return replace(base, extra_args=tuple(base.extra_args) + _pd_args("decode", None, backend))


def prefill_config(base: ServerConfig, bootstrap_port: int, backend: str = PD_TRANSFER_BACKEND) -> ServerConfig:
    """``base`` as a prefill server publishing its KV senders on ``bootstrap_port``."""
    return replace(base, extra_args=tuple(base.extra_args) + _pd_args("prefill", bootstrap_port, backend))


@dataclass
class RouterProcess:
    """``python -m sglang_router.launch_router --pd-disaggregation`` in its own session."""

    prefill_url: str
    bootstrap_port: int
    decode_url: str
    log_path: Path
    port: int = 0
    metrics_port: int = 0
    """The router's Prometheus listener: its default is one fixed port, so a second router on the
    host (another deployment, a test suite next to a benchmark) would fail to start."""
    process: subprocess.Popen | None = None
    extra_args: tuple[str, ...] = ()
    """More ``launch_router`` flags (e.g. ``--disable-retries``)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
                "--host", "127.0.0.1", "--port", str(self.port),
                "--prefill", self.prefill_url, str(self.bootstrap_port),
                "--decode", self.decode_url, "--prometheus-port", str(self.metrics_port),
                "--log-level", "warn", *self.extra_args]  # fmt: skip

    def log_tail(self, num_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 120.0, served: bool = True) -> RouterProcess:
        """Start, then wait until a one-token request through the router succeeds (``served``)
        or is answered by the servers at all (a pair that refuses every request)."""
        self.port = self.port or free_port()
        while not self.metrics_port or self.metrics_port == self.port:
            self.metrics_port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child, closed below
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent,
        )  # fmt: skip
        log.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ServerStartError(f"router exited with {self.process and self.process.returncode}; "
                                       f"log tail:\n{self.log_tail()}")
            try:
                post_json(self.url + "/generate", {"text": "hi", "sampling_params": {
                    "max_new_tokens": 1, "temperature": 0}}, timeout=60)
                return self
            except (RuntimeError, urllib.error.URLError, http.client.HTTPException, ConnectionError,
                    TimeoutError, OSError) as exc:
                last = str(exc)[:300]  # 503 "No prefill workers available" until registered
                if not served and isinstance(exc, RuntimeError) and "-> 503" not in last:
                    return self
            time.sleep(ROUTER_POLL_S)
        self.stop()
        raise ServerStartError(f"no request through the router succeeded within {timeout:.0f} s "
                               f"(last: {last}); router log tail:\n{self.log_tail()}")

    def stop(self, grace: float = 5.0) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class PdDeployment:
    """One decode server for the whole deployment; one prefill server (and router) at a time."""

    log_dir: Path
    decode: SGLangServer | None = None
    prefill: SGLangServer | None = None
    router: RouterProcess | None = None
    started: list[Any] = field(default_factory=list)
    router_args: tuple[str, ...] = ()
    """More flags for every router this deployment starts."""
    home_decode: ServerConfig | None = None
    """The decode config ``serve_prefill`` starts again after ``other_decode`` ended its own."""

    def start_decode(self, config: ServerConfig, timeout: float = 300.0) -> SGLangServer:
        if _alive(self.decode) and self.decode.config == config:
            return self.decode
        self.stop()
        server = SGLangServer(config, self.log_dir / f"decode-{len(self.started)}.log")
        self.started.append(server)
        self.decode = server.start(timeout=timeout)
        return server

    def serve_prefill(self, config: ServerConfig, timeout: float = 300.0, served: bool = True) -> RouterProcess:
        """Replace the prefill server (and its router) by one started from ``config``; with
        ``served`` False the pair may refuse every request (``RouterProcess.start``)."""
        if self.decode is None and self.home_decode is not None:
            self.start_decode(self.home_decode, timeout)
        assert self.decode is not None, "start_decode first"
        if not _alive(self.decode):
            self.restart_decode(timeout)
        if (_alive(self.prefill) and self.prefill.config == config
                and self.router is not None and self.router.process is not None):
            return self.router
        self.stop_prefill()
        bootstrap_port = _bootstrap_port_of(config)
        name = f"prefill-{len(self.started)}-pp{config.pp_size}-{config.pp_mode or 'stock'}"
        server = SGLangServer(config, self.log_dir / f"{name}.log")
        self.started.append(server)
        self.prefill = server.start(timeout=timeout)
        self.router = RouterProcess(server.url, bootstrap_port, self.decode.url,
                                    self.log_dir / f"router-{len(self.started)}.log", extra_args=self.router_args)
        self.router.start(timeout=timeout, served=served)
        return self.router

    def restart_decode(self, timeout: float = 300.0, config: ServerConfig | None = None,
                       served: bool = True) -> SGLangServer:
        """A fresh decode server from the last one's config (after a fault ended it), or from
        ``config`` (another TP size behind the same prefill server); the router, which names the
        decode server's URL, is restarted for a live prefill server, which keeps running."""
        assert self.decode is not None, "start_decode first"
        config = config if config is not None else self.decode.config
        if self.router is not None:
            self.router.stop()
            self.router = None
        self.decode.stop()
        server = SGLangServer(config, self.log_dir / f"decode-{len(self.started)}.log")
        self.started.append(server)
        self.decode = server.start(timeout=timeout)
        if _alive(self.prefill):
            self.router = RouterProcess(self.prefill.url, _bootstrap_port_of(self.prefill.config), self.decode.url,
                                        self.log_dir / f"router-{len(self.started)}.log", extra_args=self.router_args)
            self.router.start(timeout=timeout, served=served)
        return server

    @contextmanager
    def other_decode(self, config: ServerConfig, timeout: float = 300.0) -> Iterator[SGLangServer]:
        """A decode server from ``config`` (e.g. another model) for the block, then none: the
        next ``serve_prefill`` starts the deployment's own decode server again, only if asked."""
        home = self.decode.config if self.decode is not None else self.home_decode
        try:
            yield self.start_decode(config, timeout)
        finally:
            self.stop()
            self.home_decode = home

    def stop_prefill(self) -> None:
        if self.router is not None:
            self.router.stop()
            self.router = None
        if self.prefill is not None:
            self.prefill.stop()
            self.prefill = None

    def stop(self) -> None:
        self.stop_prefill()
        if self.decode is not None:
            self.decode.stop()
            self.decode = None


def _alive(server: SGLangServer | None) -> bool:
    return server is not None and server.process is not None and server.process.poll() is None


def _bootstrap_port_of(config: ServerConfig) -> int:
    args = list(config.extra_args)
    for flag, value in zip(args, args[1:]):
        if flag == "--disaggregation-bootstrap-port":
            return int(value)
    raise ValueError("a prefill config needs --disaggregation-bootstrap-port: build it with prefill_config()")

