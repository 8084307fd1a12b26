"""A VPP prefill server behind SGLang's router, with a stock pp-1 decode server, over Mooncake TCP.

The session's decode server (conftest ``deployment``, with the plugin: it publishes global KV
layer ids) serves every prefill server in turn. Through the router, four prompts of different
lengths (3 to 5 chunks of 64; the last sent while the others are in prefill) must decode to
transformers' greedy continuation, and to what the stock PP (``cpp``) prefill gave
(test_pd_router.py records that; served here only when that module did not run). On the
8-layer tiny Qwen2 at --pp-size 2, rank 0 owns layers 0-1 and 6-7 and rank 1 layers 2-5, so
positional pairing would put KV into the wrong layers; only pairing by id gives these tokens.
The vpp-pack server's trace replays through the controller (``sglang-vpp check --trace``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, get_json, post_json, wait_for_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang_vpp"))
from vpp_checks import QWEN2_8L, Reference, all_admitted_left, make_prompts  # noqa: E402
from conftest import CHUNK, PROMPT_LENGTHS, PROMPT_SEED, SERVED  # noqa: E402

from sglang_vpp.serving.launcher import free_port  # noqa: E402
from sglang_vpp.serving.pd_launcher import PdDeployment, prefill_config  # noqa: E402

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
# The first test may start the decode, cpp and vpp-pack servers (when test_pd_router.py did not
# run first): up to ~8 min on a loaded 2-core host, past the suite default of 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD, pytest.mark.timeout(1200)]

LATE_DELAY_S = 1.0
NUM_NEW = 8


@pytest.fixture(scope="module")
def model_dir(pd_model_dir) -> Path:
    return pd_model_dir


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(PROMPT_LENGTHS, seed=PROMPT_SEED)


@pytest.fixture(scope="module")
def expected(tiny_model, prompts) -> list[list[int]]:
    reference = Reference(tiny_model)
    return [reference(QWEN2_8L, ids, NUM_NEW)["tokens"] for ids in prompts]


def _serve(deployment: PdDeployment, model_dir: Path, mode: str, extra: tuple[str, ...] = ()):
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, pp_size=2, pp_mode=mode,
                        extra_args=extra)
    return deployment.serve_prefill(prefill_config(base, bootstrap_port=free_port()))


def _generate(url: str, ids: list[int]) -> list[int]:
    answer = post_json(url + "/generate", {
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW, "ignore_eos": True},
    }, timeout=600)  # fmt: skip
    return answer["output_ids"]


def _four_prompts(url: str, prompts: list[list[int]]) -> list[list[int]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        early = [pool.submit(_generate, url, ids) for ids in prompts[:-1]]
        time.sleep(LATE_DELAY_S)
        late = pool.submit(_generate, url, prompts[-1])
        return [future.result() for future in early + [late]]


def _kv_idle(server, bound_s: float = 60.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not sum(int(load["num_used_tokens"]) for load in get_json(server.url + "/v1/loads")["loads"]):
            return True
        time.sleep(1.0)
    return False


def _check(deployment: PdDeployment, label: str, got: list[list[int]], want: list[list[int]]) -> None:
    for ids, answer, expected in zip(PROMPT_LENGTHS, got, want):
        assert answer == expected, (
            f"{label}, prompt of {ids} tokens: {answer} != {expected}; prefill log tail:\n"
            f"{deployment.prefill.log_tail(3000)}\ndecode log tail:\n{deployment.decode.log_tail(2000)}"
        )
    assert _kv_idle(deployment.prefill) and _kv_idle(deployment.decode), f"{label}: KV still in use"


@pytest.fixture(scope="module")
def cpp_answers(deployment, model_dir, prompts, expected) -> list[list[int]]:
    if "cpp" not in SERVED:
        answers = _four_prompts(_serve(deployment, model_dir, "cpp").url, prompts)
        _check(deployment, "cpp prefill", answers, expected)
        SERVED["cpp"] = answers
    return SERVED["cpp"]


def test_vpp_pack_prefill_equals_cpp_and_transformers_and_its_trace_replays(
        deployment, model_dir, prompts, expected, cpp_answers, tmp_path):
    from typer.testing import CliRunner

    from sglang_vpp.cli.app import app

    trace_dir = tmp_path / "trace"
    router = _serve(deployment, model_dir, "vpp-pack", ("--vpp-trace", str(trace_dir)))
    answers = _four_prompts(router.url, prompts)
    _check(deployment, "vpp-pack prefill", answers, cpp_answers)
    _check(deployment, "vpp-pack prefill", answers, expected)
    wait_for_json(trace_dir / "vpp_rank0.records.json", until=all_admitted_left)
    wait_for_json(trace_dir / "vpp_rank1.records.json")
    replay = CliRunner().invoke(app, ["check", "--trace", str(trace_dir)])
    assert replay.exit_code == 0, replay.output
    assert "the server followed the controller" in replay.output


@pytest.mark.parametrize("mode", ["vpp", "vpp-taper", "vpp-stream"])  # vpp-async: vpp-pack without packing
def test_every_vpp_mode_prefill_equals_cpp(deployment, model_dir, prompts, cpp_answers, mode):
    router = _serve(deployment, model_dir, mode)
    _check(deployment, f"{mode} prefill", _four_prompts(router.url, prompts), cpp_answers)
