"""The deployments VPP exists for: MoE and MLA models at TP2 x PP2, on one node and over two.

One matrix of launches, each used by every check that applies to it. Models: tiny Qwen3-MoE,
DeepSeek-V3 (MLA with q_lora_rank, MoE with a dense first layer and a shared expert, yarn rope;
5 layers, so the 4 virtual stages get 2, 1, 1, 1) and GLM-4.5-MoE. Configurations:

- ``tp2pp2``: one launch, ``--tp-size 2 --pp-size 2`` (4 scheduler processes);
- ``nodes2-tp2pp2``: the same 4 ranks over two launches (``--nnodes 2 --node-rank 0|1``), each
  node one pipeline stage of two TP ranks, joined only through SGLang's ``--dist-init-addr``;
  its parallel configuration is ``tp2pp2``'s, so that cpp launch is its reference too.

Every model runs cpp at ``tp2pp2`` and one fold-back mode beside it: vpp-pack on Qwen3-MoE and
DeepSeek-V3, vpp on GLM-4.5-MoE (its blocking hand-offs, the one kind of wait vpp-pack does not
make, under TP). The two-node cell runs on DeepSeek-V3 (MLA, MoE and uneven virtual stages: the
most to go wrong) under vpp-pack. Two nodes change how the ranks are launched and joined, not a
model's layers, which each model's ``tp2pp2`` cells check on the same ranks; so the two-node cell
is not repeated per model (it costs two launches of the four ranks). Each model's cpp launch
comes first (it is launched once and shared), and every launch's tokens must equal it.

Left out, as each launch costs minutes of a CI run near its limit on a slow 2-core host:
vpp-async, vpp-taper and vpp-stream under TP (they run vpp-pack's asynchronous hand-offs and
differ from it in the schedule core's rules, which a stage's TP ranks agree on alike; every mode
runs at pp 2 in test_vpp_server.py, vpp, vpp-async and vpp-pack at pp 4 in test_vpp_models.py),
and two nodes of one rank each (``--nnodes 2 --pp-size 2``, which the PD prefill server of
tests/sglang_pd/test_pd_vpp.py runs). Checks per launch: prompts longer than the chunk sent
concurrently through the OpenAI-compatible server, greedy tokens and prompt logprobs against
transformers (within 1e-4), tokens equal to the cpp launch of the same parallel configuration,
the same for constrained decoding (regex, JSON schema and EBNF requests), the per-rank KV log
line, and on two nodes which node holds which virtual stages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sglang_harness import SKIP_NO_SGLANG, NodeLaunch, ServerConfig, SGLangServer, free_port
from sglang_vpp.models.tiny_hf import TinyModelSpec
from vpp_checks import CHUNK, GRAMMAR_POLL_ENV, QWEN3_MOE, Reference, constrained_tokens_checked, greedy_tokens_checked

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, pytest.mark.timeout(1200)]
"""The timeout counts the launch (the fixture's set-up): four ranks on two shared cores took up to
8 minutes to start on a loaded machine, before the transformers reference ran."""

_WELL_CONDITIONED = {"initializer_range": 0.1}
"""As in vpp_checks: sharp enough for a decisive argmax, mild enough for a 1e-4 logprob bound."""
DEEPSEEK_V3 = TinyModelSpec("deepseek-v3-tiny", overrides=_WELL_CONDITIONED)
GLM4_MOE = TinyModelSpec("glm4-moe-tiny", overrides=_WELL_CONDITIONED)

CONFIGS = {"tp2pp2": 1, "nodes2-tp2pp2": 2}
"""name -> nnodes; tp size 2 and pp size 2 throughout, so one cpp launch (``tp2pp2``) per model is
the token reference of every configuration."""
CELLS = (
    ("qwen3-moe", QWEN3_MOE, "tp2pp2", "cpp"),
    ("qwen3-moe", QWEN3_MOE, "tp2pp2", "vpp-pack"),
    ("deepseek-v3", DEEPSEEK_V3, "tp2pp2", "cpp"),
    ("deepseek-v3", DEEPSEEK_V3, "tp2pp2", "vpp-pack"),
    ("deepseek-v3", DEEPSEEK_V3, "nodes2-tp2pp2", "vpp-pack"),
    ("glm4-moe", GLM4_MOE, "tp2pp2", "cpp"),
    ("glm4-moe", GLM4_MOE, "tp2pp2", "vpp"),
)
"""Ordered so that each model's cpp launch runs before the launches compared with it."""
LENGTHS = (300, 37, 200, 130)
"""Five, one, four and three chunks of 64."""
TP2_BIND = "0|1|0|1"
"""Four ranks (tp-major within each pp rank) on the two cores."""
_CPP_TOKENS: dict[str, list[list[int]]] = {}
_CPP_CONSTRAINED: dict[str, list[list[int]]] = {}


def _cell_id(cell) -> str:
    name, _, config, mode = cell
    return f"{name}-{config}-{mode}"


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=CELLS, ids=[_cell_id(cell) for cell in CELLS])
def launch(request, server_pool, tiny_model, tmp_path_factory) -> Iterator[tuple]:
    """(cell, the launch serving HTTP, the node-1 launch or None)."""
    name, spec, config_name, mode = request.param
    base = ServerConfig(
        model_dir=str(tiny_model(spec)), pp_size=2, pp_mode=mode, chunked_prefill_size=CHUNK,
        extra_args=("--tp-size", "2"), extra_env=(("SGLANG_CPU_OMP_THREADS_BIND", TP2_BIND), *GRAMMAR_POLL_ENV),
    )
    if CONFIGS[config_name] == 1:
        yield request.param, server_pool.get(base, timeout=600), None
        return
    server_pool.close()  # the two launches below are the only servers while this cell runs
    log_dir = tmp_path_factory.mktemp(f"nodes-{_cell_id(request.param)}")
    init_addr = f"127.0.0.1:{free_port()}"

    def node(rank: int) -> ServerConfig:
        return replace(
            base,
            extra_args=(*base.extra_args, "--nnodes", "2", "--dist-init-addr", init_addr, "--node-rank", str(rank)),
            extra_env=(("SGLANG_CPU_OMP_THREADS_BIND", "0|1"), *GRAMMAR_POLL_ENV),  # each node's two TP ranks
        )

    follower = NodeLaunch(node(1), log_dir / "node1.log")
    leader = SGLangServer(node(0), log_dir / "node0.log")
    try:
        follower.start(timeout=600)
        leader.start(timeout=600)
        yield request.param, leader, follower
    finally:
        leader.stop()
        follower.stop()


def _record_or_compare_with_cpp(recorded: dict, cell: tuple, tokens: list[list[int]], what: str) -> None:
    """A cpp launch's tokens are recorded; a VPP launch's must equal those of its model's cpp launch
    (every configuration is TP2 x PP2)."""
    name, _, config_name, mode = cell
    if mode == "cpp":
        recorded[name] = tokens
        return
    assert name in recorded, f"the cpp launch of {name} did not run first or failed"
    assert tokens == recorded[name], f"{what}: --pp-mode {mode} at {config_name} differs from {name}'s cpp at tp2pp2"


def test_equal_transformers_and_stock_cpp(launch, reference):
    cell, server, follower = launch
    _, spec, _, mode = cell
    tokens = greedy_tokens_checked(server, spec, reference, LENGTHS, seed=29)
    _record_or_compare_with_cpp(_CPP_TOKENS, cell, tokens, "greedy tokens")
    if mode == "cpp":
        return
    logs = server.log_tail(10**7) + (follower.log_tail(10**7) if follower is not None else "")
    assert "VPP KV rank" in logs, "no per-rank KV log line"
    if follower is None:
        return
    # Each node's start-up log says which virtual stages it holds.
    held = {
        node: set(re.findall(r"VPP node (\d) holds virtual stages \((\d), (\d)\)", launch_.log_tail(10**7)))
        for node, launch_ in (("node 0", server), ("node 1", follower))
    }
    assert held["node 0"] == {("0", "0", "3")}, held
    assert held["node 1"] == {("1", "1", "2")}, held


def test_constrained_decoding_equals_stock_cpp(launch):
    """Requests waiting on their grammar under TP: pp rank 0's TP ranks agree through SGLang's
    all-gather, then rank 0's decision rides on its events (vpp/grammar_sync.py)."""
    cell, server, _ = launch
    _record_or_compare_with_cpp(_CPP_CONSTRAINED, cell, constrained_tokens_checked(server, seed=53), "constrained")
