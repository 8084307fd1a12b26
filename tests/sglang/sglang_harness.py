"""Real SGLang servers for tests: the package's launcher plus the skip marker.

The launcher (start on 127.0.0.1, wait for health, always kill the process tree, a pool that
keeps at most one server alive) is ``sglang_vpp.serving.launcher``, shared with
``sglang-vpp bench-serve --launch``. Used by tests/sglang/conftest.py; other test modules (VPP)
use the same fixtures.
"""

from __future__ import annotations

import importlib.util

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
    "SKIP_NO_SGLANG",
    "ServerConfig",
    "ServerPool",
    "SGLangServer",
    "ServerStartError",
    "free_port",
    "get_json",
    "post_json",
]


SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None
SKIP_NO_SGLANG = pytest.mark.skipif(
    not SGLANG_INSTALLED,
    reason="SGLang is not installed: run scripts/install_sglang_cpu.sh (CI does)",
)
