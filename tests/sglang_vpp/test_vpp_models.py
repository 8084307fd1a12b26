"""VPP beyond the default case: equality with stock ``--pp-mode cpp``, a Qwen3-MoE model, and
``--pp-size 4`` in every VPP mode (4 gloo processes, 8 virtual stages of one layer), whose
recorded decisions must replay through the schedule core's controller (``check --trace``).

Same prompts and oracle as test_vpp_server.py; the cpp case runs first and its tokens are the
second oracle for the 8-layer Qwen2 cases.
"""

from __future__ import annotations

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from pathlib import Path

from typer.testing import CliRunner
from order_checks import assert_planner_order_equals_the_server
from vpp_checks import (
    CHUNK,
    MIXED_LENGTHS,
    QWEN2_8L,
    QWEN3_MOE,
    Reference,
    check_answer,
    generate_concurrently,
    load_then_wait_for_decisions,
    make_prompts,
)

from sglang_vpp.cli.app import app

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

CASES = {
    "cpp": (QWEN2_8L, 2, "cpp"),
    "pp4-vpp": (QWEN2_8L, 4, "vpp"),
    "pp4-vpp-async": (QWEN2_8L, 4, "vpp-async"),
    "pp4-vpp-pack": (QWEN2_8L, 4, "vpp-pack"),
    "qwen3-moe-vpp-pack": (QWEN3_MOE, 2, "vpp-pack"),
}
_CPP_TOKENS: list[list[int]] = []


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, server_pool, tiny_model, tmp_path_factory):
    spec, pp_size, mode = CASES[request.param]
    trace_dir = tmp_path_factory.mktemp(f"trace-{request.param}")
    config = ServerConfig(model_dir=str(tiny_model(spec)), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=CHUNK,
                          extra_args=("--vpp-trace", str(trace_dir)) if mode != "cpp" else ())
    server = server_pool.get(config, timeout=400)
    server.trace_dir = Path(trace_dir)
    return request.param, spec, server


def test_equal_transformers_and_stock_cpp(case, reference):
    name, spec, server = case
    prompts = make_prompts(MIXED_LENGTHS, seed=11)
    answers = generate_concurrently(server, prompts)
    for ids, answer in zip(prompts, answers):
        check_answer(answer, ids, reference(spec, ids), server)
    tokens = [answer["output_ids"] for answer in answers]
    if name == "cpp":
        _CPP_TOKENS[:] = tokens
    elif spec == QWEN2_8L and _CPP_TOKENS:
        assert tokens == _CPP_TOKENS, "VPP tokens differ from stock --pp-mode cpp"


def test_pp4_decisions_replay_through_the_controller(case):
    name, _, server = case
    if server.config.pp_size != 4:
        pytest.skip("the pp 2 servers replay in test_vpp_server.py")
    load_then_wait_for_decisions(server, num_ranks=4)
    replay = CliRunner().invoke(app, ["check", "--trace", str(server.trace_dir)])
    assert replay.exit_code == 0, replay.output


def test_pp4_simulator_and_runtime_planner_order_equals_the_server(case, tmp_path, monkeypatch):
    name, _, server = case
    if server.config.pp_size != 4:
        pytest.skip("the pp 2 servers compare in test_vpp_server.py")
    assert_planner_order_equals_the_server(server, 4, tmp_path, monkeypatch)
