"""Real SGLang servers for tests: the package's launcher plus the skip marker.

The launcher (start on 127.0.0.1, wait for health, always kill the process tree, a pool that
keeps at most one server alive) is ``sglang_vpp.serving.launcher``, shared with
``sglang-vpp bench-serve --launch``. Used by tests/sglang/conftest.py; other test modules (VPP)
use the same fixtures.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from sglang_vpp.serving.launcher import (
    ServerConfig,
    ServerPool,
    ServerStartError,
    SGLangServer,
    free_port,
    get_json,
    post_json,
)

__all__ = [
    "POOLS",
    "SKIP_NO_SGLANG",
    "NodeLaunch",
    "ServerConfig",
    "ServerPool",
    "SGLangServer",
    "ServerStartError",
    "all_admitted_left",
    "assert_kv_idle",
    "close_idle_pools",
    "free_port",
    "get_json",
    "kv_tokens_in_use",
    "post_json",
    "wait_for_json",
]


SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None
SKIP_NO_SGLANG = pytest.mark.skipif(
    not SGLANG_INSTALLED,
    reason="SGLang is not installed: run scripts/install_sglang_cpu.sh (CI does)",
)


class NodeLaunch(SGLangServer):
    """A launch with ``--node-rank >= 1`` of a server over several nodes: it runs scheduler
    processes only and serves no HTTP, so "started" means "still running"; the node-0 launch's
    health covers both."""

    def _wait_healthy(self, deadline: float, on_wait=None) -> None:
        assert self.process is not None
        time.sleep(2.0)
        self._remember_descendants(self.process.pid)
        if self.process.poll() is not None:
            raise ServerStartError(f"node launch exited with {self.process.returncode}; log tail:\n{self.log_tail()}")


def kv_tokens_in_use(server: SGLangServer) -> int:
    """KV tokens held on every data-parallel rank of ``server`` (SGLang's ``/v1/loads``)."""
    return sum(int(load["num_used_tokens"]) for load in get_json(server.url + "/v1/loads?include=core")["loads"])


def assert_kv_idle(*servers: SGLangServer, bound_s: float = 60.0, what: str = "") -> None:
    """KV back to 0 on every one of ``servers`` within ``bound_s``; else fail naming what is held
    where. KV is freed moments after a request's answer, so a check right after it polls."""
    deadline = time.monotonic() + bound_s
    named = {server.log_path.stem: server for server in servers}
    while True:
        used = {name: kv_tokens_in_use(server) for name, server in named.items()}
        if not any(used.values()):
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}KV tokens still in use {bound_s:.0f} s after the last request: {used}")
        time.sleep(0.2)


POOLS: list[ServerPool] = []
"""The session's server pool (at most one), shared by tests/sglang and tests/sglang_vpp, whose
conftests each run the ``server_pool`` fixture; here so that both, and the teardown hook of
tests/conftest.py, find the same object."""


def close_idle_pools(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the pool's server unless the next module may use it (an idle SGLang scheduler spins a
    core). Never inside a module: a module-scoped fixture may still hold the server for a later
    test of it. A next module that uses the pool keeps the server, in case its config matches."""
    if nextitem is not None:
        module = getattr(nextitem, "module", None)
        if module is getattr(item, "module", None):
            return
        users = _POOL_MODULES.get(id(item.session))
        if users is None:
            users = {getattr(i, "module", None) for i in item.session.items
                     if "server_pool" in getattr(i, "fixturenames", ())}
            _POOL_MODULES[id(item.session)] = users
        if module in users:
            return
    for pool in POOLS:
        pool.close()


_POOL_MODULES: dict[int, set] = {}


def wait_for_json(path: Path, timeout: float = 30.0, until=None) -> dict:
    """The JSON at ``path`` once it exists (and, with ``until``, once ``until(data)`` holds: the loop
    rewrites it each time it goes idle, which may come a moment after the last response)."""
    deadline = time.monotonic() + timeout
    data = None
    while time.monotonic() < deadline:
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError:  # caught mid-write
                data = None
            if data is not None and (until is None or until(data)):
                return data
        time.sleep(0.2)  # a read of the file costs little; every trace check waits here
    # Data that does not meet ``until`` is stale: returning it would let a check pass on old records.
    if data is not None:
        raise AssertionError(f"{path} did not reach the awaited state within {timeout:.0f} s; "
                             f"last counters: {data.get('counters')}")
    raise AssertionError(f"{path} was not written (the VPP loop writes it when it goes idle)")


def all_admitted_left(data: dict) -> bool:
    """Every admitted micro-batch has left the pipeline: the records were written at idle."""
    kinds = [rec["kind"] for rec in data.get("decisions", ())]
    return kinds.count("admit") > 0 and kinds.count("admit") == kinds.count("left")
