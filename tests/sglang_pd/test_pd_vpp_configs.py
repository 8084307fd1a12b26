"""A VPP prefill server beyond pp 2 on one TP rank: TP2 x PP2, pp 4 with an uneven layer count, and
DeepSeek-V3 (MLA: the latent cache is what travels), each behind SGLang's router with a pp-1
decode server over Mooncake TCP.

Through the router, the four prompts of the PD tests (3 to 5 chunks of 64; the last sent while
the others are in prefill) must decode to transformers' greedy continuation, and KV must be back
to 0 on both sides (after a prefill-side failure, KV back to 0 and the four prompts sent again,
with a warning: ``RESENDS``):

- vpp-pack at --tp-size 2 --pp-size 2 on the 8-layer tiny Qwen2, first behind the session's
  decode server at --tp-size 1, which refuses each request with a 400 naming both attention TP
  sizes before any KV moves (the plugin's bootstrap guard; docs/pd.md), then behind
  a decode server at --tp-size 2 swapped in behind the same prefill server
  (``PdDeployment.restart_decode``): each TP rank sends its KV heads of its own layers to the
  decode rank holding those heads; also equal to what the stock pp-2 prefill served when
  test_pd_router.py ran first (another parallel config: transformers is the oracle);
- a 9-layer tiny DeepSeek-V3 (MLA with q_lora_rank, MoE) with its own decode server, serving in
  turn vpp-pack at --pp-size 4 (8 virtual stages of 2, 1, ..., 1 layers: rank 0 owns layers 0-1
  and 8, uneven) and vpp at --pp-size 2 (4 virtual stages of 3, 2, 2, 2 layers).

The TP-2 and the DeepSeek decode servers replace the session's for their tests only; the next
PD test, if any, starts the session's again. The refusal runs first so that the session's decode
server, already running, is its TP-1 decode server: one decode server start fewer.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import time
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, assert_kv_idle

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang_vpp"))
from vpp_checks import QWEN2_8L, Reference, make_prompts  # noqa: E402
from conftest import PROMPT_LENGTHS, PROMPT_SEED, SERVED, pd_decode_config  # noqa: E402
from pd_checks import (NUM_NEW, PATIENT_TRANSFER_ENV, check, four_prompts, post_status, prefill_of,  # noqa: E402
                       serve)

from sglang_vpp.models.tiny_hf import TinyModelSpec  # noqa: E402
from sglang_vpp.serving.pd_launcher import PdDeployment  # noqa: E402

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
# The DeepSeek fixture starts a decode and a pp-4 prefill server: minutes on a loaded 2-core host.
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD, pytest.mark.timeout(1200)]

DEEPSEEK_V3_9L = TinyModelSpec("deepseek-v3-tiny", num_layers=9, overrides={"initializer_range": 0.1})
"""As in tests/sglang_vpp/test_vpp_models.py: 9 layers split unevenly at pp 2 and pp 4."""
REFUSAL_BOUND_S = 20.0
"""The decode server's refusal of a request posted to it comes well within this."""
ROUTER_REFUSAL_BOUND_S = 10.0
"""Through the router, the refusal reaches the client within this: the router answers once both
servers have, and the decode server tells the prefill server to drop the room (pd_drop.py), far
below the prefill's bootstrap timeout (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300 s by default)
that would otherwise end its side."""
RESENDS = 2
"""Times the four prompts may be sent again after a prefill-side failure (``four_prompts``): these
tests check the tokens of a TP x PP, PP-4 or MLA prefill, and on the loaded 2-core host a KV send of
these deployments can fail a request, for a cause inside Mooncake's TCP transport not found yet
(docs/pd.md); each resend warns with the servers' logs, and the answers must still be
transformers'."""
TP2_ENV = (("SGLANG_CPU_OMP_THREADS_BIND", "0|1|0|1"), *PATIENT_TRANSFER_ENV)
"""Four ranks (tp-major within each pp rank) on the two cores, and Mooncake's patient bounds
(``PATIENT_TRANSFER_ENV``): these tests check tokens and refusals, not transfer latency."""


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(PROMPT_LENGTHS, seed=PROMPT_SEED)


def _expected(reference: Reference, spec: TinyModelSpec, prompts: list[list[int]]) -> list[list[int]]:
    return [reference(spec, ids, NUM_NEW)["tokens"] for ids in prompts]


def _tp_size(config: ServerConfig) -> int:
    args = list(config.extra_args)
    return int(args[args.index("--tp-size") + 1]) if "--tp-size" in args else 1


def _tp2pp2_behind(deployment: PdDeployment, model_dir: Path, decode_tp: int):
    """The router in front of the vpp-pack TP2 x PP2 prefill server, with a decode server (pp 1)
    at ``decode_tp`` of the session's model behind it: the prefill server starts once, and a
    decode server of the other TP size is swapped in behind it (``restart_decode``)."""
    decode = pd_decode_config(
        model_dir, extra_args=("--tp-size", "2") if decode_tp == 2 else (),
        extra_env=(("SGLANG_CPU_OMP_THREADS_BIND", "0|1"),) if decode_tp == 2 else (),
    )
    served = decode_tp == 2  # a TP-1 decode server refuses every request of this prefill server
    prefill = deployment.prefill
    if (prefill is not None and prefill.process is not None and prefill.config.pp_mode == "vpp-pack"
            and _tp_size(prefill.config) == 2 and deployment.decode is not None):
        if _tp_size(deployment.decode.config) != decode_tp:
            deployment.restart_decode(config=decode, served=served)
        return deployment.router
    decode_up = deployment.decode is not None and deployment.decode.process is not None
    if not decode_up or _tp_size(deployment.decode.config) != decode_tp:
        deployment.start_decode(decode)
    return deployment.serve_prefill(
        prefill_of(model_dir, "vpp-pack", ("--tp-size", "2"), extra_env=TP2_ENV), served=served)


@pytest.fixture(scope="module")
def tp2pp2(deployment: PdDeployment):
    """The deployment for the TP2 x PP2 tests; after them, the next PD test starts the session's
    decode server again (the TP-2 one took its place)."""
    home = deployment.decode.config if deployment.decode is not None else deployment.home_decode
    try:
        yield deployment
    finally:
        deployment.stop()
        deployment.home_decode = home


def test_vpp_pack_tp2_pp2_prefill_is_refused_by_a_tp1_decode(tp2pp2, pd_model_dir, prompts):
    """The prefill server behind a decode server at --tp-size 1 (the session's): the decode server
    answers each request 400 at once, naming both attention TP sizes and the fix, before it opens
    a Mooncake session (the prefill's refusal of the transfer never runs, so no session is marked
    failed: the second request gets the same reason); through the router the client gets that
    400 within ROUTER_REFUSAL_BOUND_S, the decode server having told the prefill server to drop
    the room; KV is back to 0 on both sides. The next test serves this prefill server from a
    decode server at --tp-size 2."""
    deployment = tp2pp2
    router = _tp2pp2_behind(deployment, pd_model_dir, decode_tp=1)
    reason = "at attention TP size 2 cannot serve a decode server at attention TP size 1"
    rooms = random.Random(19)
    for ids in prompts[:2]:
        payload = {"input_ids": ids, "bootstrap_host": "127.0.0.1", "bootstrap_port": router.bootstrap_port,
                   "bootstrap_room": rooms.getrandbits(62), "sampling_params": {"temperature": 0, "max_new_tokens": 2}}
        began = time.monotonic()
        status, body = post_status(deployment.decode.url + "/generate", payload, timeout=120)
        assert status == 400 and reason in body and "--tp-size 2" in body, f"decode answered {status}: {body[:500]}"
        assert time.monotonic() - began < REFUSAL_BOUND_S, f"the refusal took {time.monotonic() - began:.0f} s"
    began = time.monotonic()
    try:
        status, body = post_status(router.url + "/generate", {
            "input_ids": prompts[0], "sampling_params": {"temperature": 0, "max_new_tokens": 2}},
            timeout=4 * ROUTER_REFUSAL_BOUND_S)  # fmt: skip
    except OSError as exc:  # the prefill server kept the room: it would answer at its bootstrap timeout
        pytest.fail(f"the router did not answer within {4 * ROUTER_REFUSAL_BOUND_S:.0f} s ({exc!r}); prefill log "
                    f"tail:\n{deployment.prefill.log_tail(3000)}")
    held = time.monotonic() - began
    print(f"router answered {status} after {held:.2f} s: {body[:300]}")
    assert status == 400 and reason in body, f"router answered {status} after {held:.0f} s: {body[:500]}"
    assert held < ROUTER_REFUSAL_BOUND_S, f"the router held the refusal {held:.0f} s"
    log = deployment.prefill.log_tail(200_000)
    # The prefill side ended the room itself (pd_drop: the abort on its loop, or its input guard
    # when the refusal came first), not at its bootstrap timeout.
    assert "the decode server refused this request" in log, log[-3000:]
    assert "(decode session" not in log, "a transfer was attempted: " + log[-3000:]  # vpp/pd_prefill's refusal
    assert "not alive" not in log, log[-3000:]  # Mooncake's failed-session error
    assert_kv_idle(deployment.prefill, deployment.decode, what="vpp-pack tp2 x pp2 prefill, tp1 decode: ")


def test_vpp_pack_tp2_pp2_prefill_equals_transformers(tp2pp2, pd_model_dir, prompts, reference):
    """The same prefill server (started by the test above, or here when run alone) behind a
    decode server at --tp-size 2."""
    began = time.monotonic()
    deployment = tp2pp2
    router = _tp2pp2_behind(deployment, pd_model_dir, decode_tp=2)
    answers = four_prompts(router.url, prompts, deployment, resends=RESENDS)
    check(deployment, "vpp-pack tp2 x pp2 prefill", answers, _expected(reference, QWEN2_8L, prompts))
    if "cpp" in SERVED:
        check(deployment, "vpp-pack tp2 x pp2 prefill vs stock pp 2", answers, SERVED["cpp"])
    print(f"vpp-pack tp2 x pp2: {time.monotonic() - began:.0f} s")


@pytest.fixture(scope="module")
def deepseek(deployment: PdDeployment, tiny_model):
    """The deployment with a decode server (pp 1) of the 9-layer DeepSeek-V3, for this module."""
    model_dir = tiny_model(DEEPSEEK_V3_9L)
    with deployment.other_decode(pd_decode_config(model_dir)):
        yield deployment, model_dir


@pytest.mark.parametrize(("mode", "pp_size"), [("vpp-pack", 4), ("vpp", 2)], ids=["vpp-pack-pp4", "vpp-pp2"])
def test_deepseek_v3_mla_prefill_equals_transformers(deepseek, prompts, reference, mode, pp_size):
    began = time.monotonic()
    deployment, model_dir = deepseek
    router = serve(deployment, model_dir, mode, pp_size=pp_size, extra_env=PATIENT_TRANSFER_ENV)
    answers = four_prompts(router.url, prompts, deployment, resends=RESENDS)
    check(deployment, f"DeepSeek-V3 {mode} pp {pp_size} prefill", answers,
          _expected(reference, DEEPSEEK_V3_9L, prompts))
    print(f"DeepSeek-V3 {mode} pp {pp_size}: {time.monotonic() - began:.0f} s")

