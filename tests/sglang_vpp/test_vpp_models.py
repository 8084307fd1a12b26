"""VPP beyond the default case: equality with stock ``--pp-mode cpp``, a Qwen3-MoE model, and
``--pp-size 4 --pp-mode vpp-async`` (4 gloo processes, 8 virtual stages of one layer).

Same prompts and oracle as test_vpp_server.py; the cpp case runs first and its tokens are the
second oracle for the 8-layer Qwen2 cases.
"""

from __future__ import annotations

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from vpp_checks import (
    CHUNK,
    MIXED_LENGTHS,
    QWEN2_8L,
    QWEN3_MOE,
    Reference,
    check_answer,
    generate_concurrently,
    make_prompts,
)

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

CASES = {
    "cpp": (QWEN2_8L, 2, "cpp"),
    "pp4-vpp-async": (QWEN2_8L, 4, "vpp-async"),
    "qwen3-moe-vpp-pack": (QWEN3_MOE, 2, "vpp-pack"),
}
_CPP_TOKENS: list[list[int]] = []


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, server_pool, tiny_model):
    spec, pp_size, mode = CASES[request.param]
    config = ServerConfig(model_dir=str(tiny_model(spec)), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=CHUNK)
    return request.param, spec, server_pool.get(config, timeout=400)


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
