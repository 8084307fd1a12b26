"""``--tp-size 2 --pp-size 2``: the VPP modes return stock ``--pp-mode cpp``'s greedy tokens.

Four scheduler processes per server (two pipelines, one per TP index), bound round-robin to the
machine's cores. One server per mode (the pool holds one at a time); the cpp server of the same
parallel configuration runs first and its tokens are the oracle, with transformers' prompt
logprobs as the second one. Prompts longer than the chunk, sent concurrently.
"""

from __future__ import annotations

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from vpp_checks import CHUNK, QWEN2_8L, Reference, greedy_tokens_checked

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

MODES = ("cpp", "vpp-pack", "vpp")
"""vpp-async at TP2 x PP2: test_vpp_nnodes.py (the same four ranks over two launches)."""
LENGTHS = (300, 37, 200, 130)
"""Five, one, four and three chunks of 64."""
TP2_BIND = (("SGLANG_CPU_OMP_THREADS_BIND", "0|1|0|1"),)
"""Four ranks (tp-major within each pp rank) on the two cores."""
_CPP_TOKENS: list[list[int]] = []


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=MODES, ids=MODES)
def server(request, server_pool, tiny_model):
    config = ServerConfig(
        model_dir=str(tiny_model(QWEN2_8L)), pp_size=2, pp_mode=request.param, chunked_prefill_size=CHUNK,
        extra_args=("--tp-size", "2"), extra_env=TP2_BIND,
    )
    return server_pool.get(config, timeout=600)


def test_tp2_pp2_equal_stock_cpp_and_transformers(server, reference):
    tokens = greedy_tokens_checked(server, QWEN2_8L, reference, LENGTHS, seed=23)
    if server.config.pp_mode == "cpp":
        _CPP_TOKENS[:] = tokens
    else:
        assert _CPP_TOKENS, "the cpp server of this configuration did not run first"
        assert tokens == _CPP_TOKENS, f"--pp-mode {server.config.pp_mode} tokens differ from stock cpp at TP2 x PP2"
