"""Fixtures for tests against real SGLang servers (see sglang_harness.py).

- ``tiny_model(spec)``: build (once per session) a tiny HF model directory for a TinyModelSpec.
- ``tiny_model_dir``: the default qwen2-tiny (4 layers) directory.
- ``server_pool``: one pool for the whole session (tests/sglang_vpp re-exports this fixture and
  gets the same pool), so a config asked for by two modules in a row starts once. It keeps at most
  one server alive; ``sglang_harness.close_idle_pools`` (called by tests/conftest.py after every test) stops that
  server as soon as the next test is in another module and does not use the pool: an idle SGLang
  scheduler spins a core, which a 2-vCPU machine cannot spare. Killed at the end of the session,
  on failure too (and by the launcher's atexit if pytest itself is killed).
- Module order inside tests/sglang chains the pool's configs (``pytest_collection_modifyitems``).

Modules that need SGLang use ``sglang_harness.SKIP_NO_SGLANG`` (skips with the reason).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from sglang_harness import POOLS, ServerPool  # noqa: E402

from sglang_vpp.models.tiny_hf import TinyModelSpec, build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[TinyModelSpec], Path]:
    built: dict[TinyModelSpec, Path] = {}

    def make(spec: TinyModelSpec) -> Path:
        if spec not in built:
            out = tmp_path_factory.mktemp(f"model-{spec.preset}")
            built[spec] = build_tiny_model(out, spec)
        return built[spec]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model: Callable[[TinyModelSpec], Path]) -> Path:
    return tiny_model(TinyModelSpec("qwen2-tiny"))


# Server modules whose pool configs chain: each module's first server is the previous one's last
# (pp 2 cpp, then pp 1 stock with chunks of 64), so the pool reuses it instead of starting it
# again. They run first, in this order; every other module keeps its place after them.
CHAINED_MODULES = ("test_guard_and_load.py", "test_server_generate.py", "test_bench_serve.py")


@pytest.fixture(scope="session")
def server_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    if not POOLS:  # tests/sglang_vpp runs this fixture again (its own copy): same pool
        POOLS.append(ServerPool(log_dir=tmp_path_factory.mktemp("sglang-logs")))
    try:
        yield POOLS[0]
    finally:
        POOLS[0].close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.fspath))
        if path.parent == here and path.name in CHAINED_MODULES:
            return CHAINED_MODULES.index(path.name)
        return len(CHAINED_MODULES)

    mine = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == here]
    if mine:
        ordered = sorted((items[i] for i in mine), key=rank)  # stable: order within a module kept
        for i, item in zip(mine, ordered):
            items[i] = item
