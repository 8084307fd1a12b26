"""Fixtures for tests against real SGLang servers (see sglang_harness.py).

- ``tiny_model(spec)``: build (once per session) a tiny HF model directory for a TinyModelSpec.
- ``tiny_model_dir``: the default qwen2-tiny (4 layers) directory.
- ``server_pool``: session-wide pool that keeps at most one server alive and kills it at the
  end of the session, on failure too.

Modules that need SGLang use ``sglang_harness.SKIP_NO_SGLANG`` (skips with the reason).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from sglang_harness import ServerPool  # noqa: E402

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


@pytest.fixture(scope="session")
def server_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    pool = ServerPool(log_dir=tmp_path_factory.mktemp("sglang-logs"))
    try:
        yield pool
    finally:
        pool.close()
