"""Fixtures for the prefill-decode (PD) tests: the plugin's harness, imported (not copied).

``tests/sglang/conftest.py`` builds tiny models; it is loaded here under another module name and
its ``tiny_model`` fixture re-exported. The PD deployment itself (one decode server, prefill
servers in turn, SGLang's router) is ``sglang_vpp.serving.pd_launcher.PdDeployment``.

One decode server serves every PD test module (``deployment``): each asks it for its prefill
servers in turn (``deployment.serve_prefill``), a test whose fault ends the decode server restarts
it (``deployment.restart_decode``) before it returns, a module that needs another decode server
(another model or TP size) swaps it in (``deployment.other_decode``; a later request for a
prefill server starts the session's again), and the deployment stops after the last PD test
(``pytest_runtest_teardown``), not at the end of the session: the modules after it need the
cores and the memory. The model is the 8-layer tiny Qwen2: at --pp-size 2 under fold-back rank 0
owns layers 0-1 and 6-7, so only KV paired by global layer id gives the right tokens.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_HARNESS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang")
sys.path.insert(0, _HARNESS_DIR)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang_vpp"))
from vpp_checks import QWEN2_8L  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from pd_checks import CHUNK, PROMPT_LENGTHS  # noqa: E402,F401 (re-exported to the test modules)

_spec = importlib.util.spec_from_file_location("sglang_harness_pd_conftest", os.path.join(_HARNESS_DIR, "conftest.py"))
_harness_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness_conftest)

tiny_model = _harness_conftest.tiny_model

PREFILL_MODES = ["cpp"]
"""``--pp-mode`` of the prefill servers (``--pp-size 2``) that test_pd_router.py runs in turn
against the session's decode server: correctness, bad input, aborts and faults."""
PROMPT_SEED = 1919
DECODE_KV_RELEASE_TIMEOUT_S = 10
"""SGLang's ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`` (default 30 s) on every
decode server of the tests: the tests' "KV back to 0" waits it out where no drain ack comes (a
refused transfer, a killed prefill rank; docs/pd.md, end of "Aborts and faults"). 10 s still
outlasts a tiny model's KV transfer over TCP."""

SERVED: dict[str, list[list[int]]] = {}
"""Greedy ids of the four prompts per prefill ``--pp-mode``, as the router returned them: the
VPP modes are compared with what stock PP (``cpp``) served, without starting it twice."""
_DEPLOYMENTS: list = []


def pd_decode_config(model_dir: Path, extra_args: tuple[str, ...] = (),
                     extra_env: tuple[tuple[str, str], ...] = ()):
    """A decode server (pp 1) of the model at ``model_dir``, as every PD test starts one."""
    from sglang_harness import ServerConfig

    from sglang_vpp.serving.pd_launcher import decode_config

    release = (("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", str(DECODE_KV_RELEASE_TIMEOUT_S)),)
    return decode_config(ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, extra_args=extra_args,
                                      extra_env=(*extra_env, *release)))


@pytest.fixture(scope="session")
def pd_model_dir(tiny_model) -> Path:
    return tiny_model(QWEN2_8L)


@pytest.fixture(scope="session")
def deployment(tmp_path_factory, pd_model_dir: Path):
    """One decode server (pp 1) for the session; prefill servers and the router come and go."""
    from sglang_vpp.serving.pd_launcher import PdDeployment

    # No retries: a request that fails (a fault) is reported, not sent again to the same pair.
    pd = PdDeployment(log_dir=tmp_path_factory.mktemp("pd-logs"), router_args=("--disable-retries",))
    _DEPLOYMENTS.append(pd)
    try:
        pd.start_decode(pd_decode_config(pd_model_dir))
        yield pd
    finally:
        pd.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    here = Path(__file__).parent
    if nextitem is None or here not in Path(str(nextitem.fspath)).parents:
        for pd in _DEPLOYMENTS:
            pd.stop()
