"""Fixtures for the prefill-decode (PD) tests: the plugin's harness, imported (not copied).

``tests/sglang/conftest.py`` builds tiny models; it is loaded here under another module name and
its ``tiny_model`` fixture re-exported. The PD deployment itself (one decode server, prefill
servers in turn, SGLang's router) is ``sglang_vpp.serving.pd_launcher.PdDeployment``.

One decode server serves the whole session (``deployment``): every PD test module asks it for
its prefill servers in turn (``deployment.serve_prefill``), and a test whose fault ends the
decode server restarts it (``deployment.restart_decode``) before it returns.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang")
sys.path.insert(0, _HARNESS_DIR)

_spec = importlib.util.spec_from_file_location("sglang_harness_pd_conftest", os.path.join(_HARNESS_DIR, "conftest.py"))
_harness_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness_conftest)

tiny_model = _harness_conftest.tiny_model

PREFILL_MODES = ["cpp"]
"""``--pp-mode`` of the prefill servers (``--pp-size 2``) that test_pd_router.py runs in turn
against the session's decode server: correctness, bad input, aborts and faults."""
CHUNK = 64
"""``--chunked-prefill-size`` of every PD server of the tests."""


@pytest.fixture(scope="session")
def pd_model_dir(tiny_model) -> Path:
    from sglang_vpp.models.tiny_hf import TinyModelSpec

    return tiny_model(TinyModelSpec("qwen2-tiny"))


@pytest.fixture(scope="session")
def deployment(tmp_path_factory, pd_model_dir: Path):
    """One decode server (pp 1) for the session; prefill servers and the router come and go."""
    from sglang_harness import ServerConfig

    from sglang_vpp.serving.pd_launcher import PdDeployment, decode_config

    # No retries: a request that fails (a fault) is reported, not sent again to the same pair.
    pd = PdDeployment(log_dir=tmp_path_factory.mktemp("pd-logs"), router_args=("--disable-retries",))
    try:
        pd.start_decode(decode_config(ServerConfig(model_dir=str(pd_model_dir), chunked_prefill_size=CHUNK)))
        yield pd
    finally:
        pd.stop()
