"""A prefill-decode split through SGLang's router on CPU (Mooncake over TCP).

One decode server (pp 1) serves every prefill server of the module in turn; the router is
restarted for each prefill server and waited on until a request through it succeeds. Four
prompts of different lengths (several chunks of 64 each; the last one sent while the others are
in prefill) go through the router concurrently: the decode server's greedy ids must equal
transformers' greedy continuation, for every prefill server. Then bad input and faults on the
same servers: 32 concurrent mixed requests (KV back to 0 on both sides), an unreachable
bootstrap address (400), and last, kill -9 of prefill rank 1 (named in the log, the router's
clients get an error instead of hanging).
"""

from __future__ import annotations

import importlib.util
import time
import json
import random
import signal
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fault_driver import KILL_BOUND_S, assert_fault_ends_the_server
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, SGLangServer, get_json, post_json

from sglang_vpp.models.tiny_hf import TinyModelSpec
from sglang_vpp.serving.pd_launcher import PdDeployment, decode_config, prefill_config
from sglang_vpp.serving.launcher import free_port

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD]

CHUNK = 64
PROMPT_LENGTHS = (300, 200, 150, 130)
"""3 to 5 chunks of 64 each; the last one is sent while the first three are in prefill."""
LATE_DELAY_S = 1.0
NUM_NEW_TOKENS = 8
MODEL = TinyModelSpec("qwen2-tiny")

PREFILLS = {
    "cpp-pp2": dict(pp_size=2, pp_mode="cpp"),
}


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model(MODEL)


def _prompts(lengths, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 10000) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return _prompts(PROMPT_LENGTHS, 1919)


@pytest.fixture(scope="module")
def greedy(model_dir: Path):
    """transformers' greedy continuation of a prompt (the oracle), memoised."""
    import torch
    from transformers import GenerationConfig

    from sglang_vpp.models.tiny_hf import load_transformers_model

    model = load_transformers_model(model_dir)
    config = GenerationConfig(max_new_tokens=NUM_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=1)
    cache: dict[tuple[int, ...], list[int]] = {}

    def continuation(ids: list[int]) -> list[int]:
        if tuple(ids) not in cache:
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), generation_config=config)
            cache[tuple(ids)] = out[0, len(ids):].tolist()
        return cache[tuple(ids)]

    return continuation


@pytest.fixture(scope="module")
def reference(greedy, prompts) -> list[list[int]]:
    return [greedy(ids) for ids in prompts]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, model_dir: Path):
    pd = PdDeployment(log_dir=tmp_path_factory.mktemp("pd-logs"))
    try:
        pd.start_decode(decode_config(ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK)))
        yield pd
    finally:
        pd.stop()


@pytest.fixture(scope="module", params=list(PREFILLS), ids=list(PREFILLS))
def router(request, deployment: PdDeployment, model_dir: Path):
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, **PREFILLS[request.param])
    return deployment.serve_prefill(prefill_config(base, bootstrap_port=free_port()))


def _generate(url: str, ids: list[int]) -> dict:
    return post_json(url + "/generate", {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW_TOKENS, "ignore_eos": True},
    }, timeout=600)  # fmt: skip


def test_concurrent_prompts_equal_transformers(router, deployment, prompts, reference):
    with ThreadPoolExecutor(len(prompts)) as pool:
        early = [pool.submit(_generate, router.url, ids) for ids in prompts[:-1]]
        time.sleep(LATE_DELAY_S)
        late = pool.submit(_generate, router.url, prompts[-1])
        answers = [f.result() for f in early + [late]]
    for ids, answer, expected in zip(prompts, answers, reference):
        assert answer["output_ids"] == expected, (
            f"prompt of {len(ids)} tokens: PD {answer['output_ids']} != transformers {expected}; "
            f"prefill log tail:\n{deployment.prefill.log_tail(3000)}\ndecode log tail:\n"
            f"{deployment.decode.log_tail(3000)}"
        )


MIXED_LENGTHS = (5, 37, 64, 130, 300, 450, 200, 90)
NUM_MIXED = 32


def _kv_in_use(server: SGLangServer) -> int:
    return sum(int(load["num_used_tokens"]) for load in get_json(server.url + "/v1/loads")["loads"])


def _assert_kv_idle(deployment: PdDeployment, bound_s: float = 60.0) -> None:
    deadline = time.monotonic() + bound_s
    servers = {"prefill": deployment.prefill, "decode": deployment.decode}
    while time.monotonic() < deadline:
        used = {name: _kv_in_use(server) for name, server in servers.items()}
        if not any(used.values()):
            return
        time.sleep(1.0)
    raise AssertionError(f"KV tokens still in use {bound_s:.0f} s after the last request: {used}")


def test_32_concurrent_mixed_all_served_equal_transformers_kv_idle(router, deployment, greedy):
    prompts = _prompts([MIXED_LENGTHS[i % len(MIXED_LENGTHS)] for i in range(NUM_MIXED)], 32)
    with ThreadPoolExecutor(NUM_MIXED) as pool:
        answers = list(pool.map(lambda ids: _generate(router.url, ids), prompts))
    wrong = [(len(ids), a["output_ids"], greedy(ids)) for ids, a in zip(prompts, answers)
             if a["output_ids"] != greedy(ids)]
    assert not wrong, f"{len(wrong)} of {NUM_MIXED} differ from transformers, e.g. {wrong[:2]}"
    _assert_kv_idle(deployment)


def _post_status(url: str, payload: dict, timeout: float) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@pytest.mark.parametrize("where", ["unreachable-host", "closed-port"])
def test_bad_bootstrap_address_is_a_client_error(router, deployment, prompts, reference, where):
    """A client that names a bootstrap server nobody runs gets a 400 from the decode server
    (the plugin's guard; stock SGLang answers 500 after a failed handshake), and the pair keeps
    serving."""
    host, port = ("10.255.255.1", 8998) if where == "unreachable-host" else ("127.0.0.1", 1)
    payload = {"input_ids": prompts[-1], "bootstrap_host": host, "bootstrap_port": port,
               "bootstrap_room": random.Random(5).getrandbits(62),
               "sampling_params": {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}}
    status, body = _post_status(deployment.decode.url + "/generate", payload, timeout=120)
    assert status == 400 and "unreachable" in body, f"decode answered {status}: {body[:500]}"
    assert _generate(router.url, prompts[-1])["output_ids"] == reference[-1]
    _assert_kv_idle(deployment)


def test_killed_prefill_rank_is_named_and_router_clients_get_an_error(router, deployment, prompts):
    """Last use of the prefill server: kill -9 of pp rank 1 ends it with one log line naming
    the rank; a request through the router then fails within a bound instead of hanging."""
    assert_fault_ends_the_server(deployment.prefill, "pd-cpp-kill-rank1-idle", signal.SIGKILL, 1, "idle",
                                 KILL_BOUND_S)
    began = time.monotonic()
    status, body = _post_status(router.url + "/generate", {
        "input_ids": prompts[0], "sampling_params": {"max_new_tokens": 2}}, timeout=120)
    assert status >= 400, f"router answered {status} with its prefill server gone: {body[:300]}"
    assert time.monotonic() - began < 120
