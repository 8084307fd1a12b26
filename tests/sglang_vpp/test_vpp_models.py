"""VPP beyond the default case: ``--pp-size 4`` with an uneven layer count in every VPP mode, and
DeepSeek-V2 (MLA without q_lora_rank) against stock ``--pp-mode cpp``.

``--pp-size 4``: a 9-layer tiny DeepSeek-V3 (MLA with q_lora_rank, MoE with a dense first layer
and a shared expert, yarn rope) on 4 gloo processes, 8 virtual stages: the default split (2, then
seven of 1) and, under vpp-async, ``--vpp-layer-split 1,1,2,1,1,1,1,1``; vpp-pack runs with
``--vpp-fold fused`` (7 stages: the last rank runs its two as one). Oracle: transformers'
greedy tokens and prompt logprobs (within 1e-4) on prompts longer than the chunk, concurrently;
each server's recorded decisions must replay through the schedule core's controller
(``check --trace --reproduce``; every VPP case below too).

DeepSeek-V2 (pp 2, ``--vpp-layer-split 1,2,1,1``, ``--pp-mode vpp``) against stock cpp only: on
that tiny config stock SGLang's DeepSeek-V2 itself differs from transformers' (docs/sglang-vpp.md),
so transformers is no oracle for it. Its cpp case runs first.

Llama (pp 2, 7 layers: an odd count over 4 virtual stages, ``--pp-mode vpp-async``) against
transformers: the dense model class most deployments start from.

MoE and MLA at TP2 x PP2 and over two nodes: test_vpp_deploy_matrix.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from typer.testing import CliRunner
from order_checks import assert_planner_order_equals_the_server
from vpp_checks import (
    CHUNK,
    GRAMMAR_POLL_ENV,
    Reference,
    constrained_tokens_checked,
    generate_concurrently,
    greedy_tokens_checked,
    load_then_wait_for_decisions,
    make_prompts,
)

from sglang_vpp.cli.app import app
from sglang_vpp.models.tiny_hf import TinyModelSpec

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

_WELL_CONDITIONED = {"initializer_range": 0.1}
"""As in vpp_checks: sharp enough for a decisive argmax, mild enough for a 1e-4 logprob bound."""
DEEPSEEK_V3_9L = TinyModelSpec("deepseek-v3-tiny", num_layers=9, overrides=_WELL_CONDITIONED)
DEEPSEEK_V2 = TinyModelSpec("deepseek-v2-tiny", overrides=_WELL_CONDITIONED)
LLAMA_7L = TinyModelSpec("llama-tiny", num_layers=7, overrides=_WELL_CONDITIONED)

CASES = {
    "deepseek-v3-9l-pp4-vpp": (DEEPSEEK_V3_9L, 4, "vpp", ()),
    "deepseek-v3-9l-pp4-vpp-async": (DEEPSEEK_V3_9L, 4, "vpp-async", ("--vpp-layer-split", "1,1,2,1,1,1,1,1")),
    "deepseek-v3-9l-pp4-vpp-pack-fused": (DEEPSEEK_V3_9L, 4, "vpp-pack", ("--vpp-fold", "fused")),
    "deepseek-v2-pp2-cpp": (DEEPSEEK_V2, 2, "cpp", ()),
    "deepseek-v2-pp2-vpp": (DEEPSEEK_V2, 2, "vpp", ("--vpp-layer-split", "1,2,1,1")),
    "llama-7l-pp2-vpp-async": (LLAMA_7L, 2, "vpp-async", ()),
}
LENGTHS = (300, 37, 200, 130)
"""Five, one, four and three chunks of 64."""
_DEEPSEEK_V2_CPP_TOKENS: list[list[int]] = []
_DEEPSEEK_V2_CPP_CONSTRAINED: list[list[int]] = []


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, server_pool, tiny_model, tmp_path_factory):
    spec, pp_size, mode, extra = CASES[request.param]
    trace_dir = tmp_path_factory.mktemp(f"trace-{request.param}")
    trace = ("--vpp-trace", str(trace_dir)) if mode != "cpp" else ()
    config = ServerConfig(model_dir=str(tiny_model(spec)), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=CHUNK,
                          extra_args=(*extra, *trace), extra_env=GRAMMAR_POLL_ENV)
    server = server_pool.get(config, timeout=600)
    server.trace_dir = Path(trace_dir)
    return spec, server


def test_equal_transformers_or_stock_cpp(case, reference):
    spec, server = case
    if spec != DEEPSEEK_V2:
        greedy_tokens_checked(server, spec, reference, LENGTHS, seed=29)
        return
    tokens = [answer["output_ids"] for answer in generate_concurrently(server, make_prompts(LENGTHS, seed=29))]
    if server.config.pp_mode == "cpp":
        _DEEPSEEK_V2_CPP_TOKENS[:] = tokens
        return
    assert _DEEPSEEK_V2_CPP_TOKENS, "the DeepSeek-V2 cpp case did not run first or failed"
    assert tokens == _DEEPSEEK_V2_CPP_TOKENS, f"--pp-mode {server.config.pp_mode} tokens differ from stock cpp"
    assert "VPP KV rank" in server.log_tail(10**7), "no per-rank KV log line"


def test_constrained_decoding_follows_each_grammar_and_equals_stock_cpp(case):
    """At pp 4 rank 0's grammar decisions pass through three followers in turn."""
    spec, server = case
    tokens = constrained_tokens_checked(server, seed=53)
    if spec != DEEPSEEK_V2:
        return
    if server.config.pp_mode == "cpp":
        _DEEPSEEK_V2_CPP_CONSTRAINED[:] = tokens
        return
    assert _DEEPSEEK_V2_CPP_CONSTRAINED, "the DeepSeek-V2 cpp case did not run first or failed"
    assert tokens == _DEEPSEEK_V2_CPP_CONSTRAINED, f"--pp-mode {server.config.pp_mode} differs from stock cpp"


def test_decisions_replay_through_the_controller(case):
    _, server = case
    if server.config.pp_mode == "cpp":
        pytest.skip("stock cpp takes no controller decisions")
    load_then_wait_for_decisions(server, num_ranks=server.config.pp_size)
    replay = CliRunner().invoke(app, ["check", "--trace", str(server.trace_dir), "--reproduce"])
    assert replay.exit_code == 0, replay.output
    assert "reproduced record by record" in replay.output
    print(replay.output)  # records compared per rank (pytest -rP)


def test_pp4_simulator_and_runtime_planner_order_equals_the_server(case, tmp_path, monkeypatch):
    _, server = case
    if server.config.pp_size != 4:
        pytest.skip("the pp 2 servers compare in test_vpp_server.py")
    assert_planner_order_equals_the_server(server, 4, tmp_path, monkeypatch)
