"""The model classes VPP is deployed with: DeepSeek-V3 (MLA with q_lora_rank, MoE with a dense
first layer and a shared expert, yarn rope) and GLM-4.5-MoE, with uneven layer counts under the
default split and ``--vpp-layer-split``, and DeepSeek-V2 (MLA without q_lora_rank) against
stock cpp only: stock SGLang's DeepSeek-V2 and transformers' disagree on the tiny config, so
transformers is no oracle for it (docs/sglang-vpp.md).

One server per case (the pool holds one at a time). Oracle: transformers' greedy tokens and
prompt logprobs (within 1e-4); the DeepSeek-V3 cpp server of the same configuration runs first
and its tokens are the second oracle for the VPP case of that configuration. Prompts longer than
the chunk, sent concurrently.
"""

from __future__ import annotations

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from sglang_vpp.models.tiny_hf import TinyModelSpec
from vpp_checks import CHUNK, Reference, generate_concurrently, greedy_tokens_checked, make_prompts

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

_WELL_CONDITIONED = {"initializer_range": 0.1}
"""As in vpp_checks: sharp enough for a decisive argmax, mild enough for a 1e-4 logprob bound."""
DEEPSEEK_V3 = TinyModelSpec("deepseek-v3-tiny", overrides=_WELL_CONDITIONED)
"""5 layers: 4 virtual stages at pp 2 get 2, 1, 1, 1 (the default split is uneven)."""
DEEPSEEK_V3_9L = TinyModelSpec("deepseek-v3-tiny", num_layers=9, overrides=_WELL_CONDITIONED)
DEEPSEEK_V2 = TinyModelSpec("deepseek-v2-tiny", overrides=_WELL_CONDITIONED)
GLM4_MOE = TinyModelSpec("glm4-moe-tiny", overrides=_WELL_CONDITIONED)

CASES = {
    "deepseek-v3-pp2-cpp": (DEEPSEEK_V3, 2, "cpp", ()),
    "deepseek-v3-pp2-vpp-pack": (DEEPSEEK_V3, 2, "vpp-pack", ()),
    "deepseek-v3-9l-pp4-vpp-async": (DEEPSEEK_V3_9L, 4, "vpp-async", ("--vpp-layer-split", "2,1,1,1,1,1,1,1")),
    "glm4-moe-pp2-vpp-pack": (GLM4_MOE, 2, "vpp-pack", ()),
    "deepseek-v2-pp2-cpp": (DEEPSEEK_V2, 2, "cpp", ()),
    "deepseek-v2-pp2-vpp": (DEEPSEEK_V2, 2, "vpp", ("--vpp-layer-split", "1,2,1,1")),
}
NO_TRANSFORMERS_ORACLE = frozenset({DEEPSEEK_V2})
LENGTHS = (300, 37, 200, 130)
"""Five, one, four and three chunks of 64."""
_CPP_TOKENS: dict[tuple, list[list[int]]] = {}


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, server_pool, tiny_model):
    spec, pp_size, mode, extra = CASES[request.param]
    config = ServerConfig(
        model_dir=str(tiny_model(spec)), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=CHUNK, extra_args=extra,
    )
    return spec, server_pool.get(config, timeout=600)


def test_equal_transformers_and_stock_cpp(case, reference):
    spec, server = case
    if spec in NO_TRANSFORMERS_ORACLE:
        tokens = [answer["output_ids"] for answer in generate_concurrently(server, make_prompts(LENGTHS, seed=29))]
    else:
        tokens = greedy_tokens_checked(server, spec, reference, LENGTHS, seed=29)
    key = (spec, server.config.pp_size)
    if server.config.pp_mode == "cpp":
        _CPP_TOKENS[key] = tokens
    else:
        assert key in _CPP_TOKENS or spec not in NO_TRANSFORMERS_ORACLE, "its cpp case did not run first"
        assert key not in _CPP_TOKENS or tokens == _CPP_TOKENS[key], f"--pp-mode {server.config.pp_mode} tokens differ from stock cpp"
    assert "VPP KV rank" in server.log_tail(10**7) or server.config.pp_mode == "cpp", "no per-rank KV log line"
