"""A prefill-decode split through SGLang's router on CPU (Mooncake over TCP).

The session's decode server (pp 1, conftest ``deployment``) serves each prefill server of
``PREFILL_MODES`` (pp 2) in turn; the router is restarted for each and waited on until a
request through it succeeds. Four prompts of different lengths (several chunks of 64 each; the
last one sent while the others are in prefill) go through the router concurrently: the decode
server's greedy ids must equal transformers' greedy continuation, for every prefill server.
Then bad input, aborts and faults on the same servers, in this order: 32 concurrent mixed
requests (KV back to 0 on both sides), an unreachable bootstrap address (400), an abort in
bootstrap, an abort mid-transfer, a client that disconnects from the router, kill -9 of the
decode server mid-transfer (the decode server is restarted), and last kill -9 of prefill rank 1
(named in the log; clients in flight and after get an error instead of hanging). After each
abort and fault: the client got an error, KV back to 0 and a following request served right.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import threading
import time
import urllib.error
from pathlib import Path

import pytest
from fault_driver import KILL_BOUND_S, assert_fault_ends_the_server
from vpp_checks import QWEN2_8L, Reference, make_prompts
from conftest import CHUNK, PREFILL_MODES, PROMPT_LENGTHS, PROMPT_SEED, SERVED
from pd_checks import (ERROR_BOUND_S, LONG_PROMPT, NUM_NEW, check_mixed, four_prompts, generate, post_status,
                       prefill_batches_logged, server_evidence, wait_in_prefill)
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, assert_kv_idle, kv_tokens_in_use

from sglang_vpp.serving.pd_launcher import PdDeployment, prefill_config
from sglang_vpp.serving.launcher import free_port

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD]

NUM_NEW_TOKENS = NUM_NEW
PREFILL_PP = 2


@pytest.fixture(scope="module")
def model_dir(pd_model_dir) -> Path:
    return pd_model_dir


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(PROMPT_LENGTHS, PROMPT_SEED)


@pytest.fixture(scope="module")
def greedy(tiny_model):
    """transformers' greedy continuation of a prompt: the oracle every server test uses."""
    oracle = Reference(tiny_model)
    return lambda ids: oracle(QWEN2_8L, ids, NUM_NEW_TOKENS)["tokens"]


@pytest.fixture(scope="module")
def reference(greedy, prompts) -> list[list[int]]:
    return [greedy(ids) for ids in prompts]


@pytest.fixture(scope="module", params=PREFILL_MODES, ids=[f"{mode}-pp{PREFILL_PP}" for mode in PREFILL_MODES])
def router(request, deployment: PdDeployment, model_dir: Path):
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, pp_size=PREFILL_PP,
                        pp_mode=request.param)
    return deployment.serve_prefill(prefill_config(base, bootstrap_port=free_port()))


def test_concurrent_prompts_equal_transformers(router, deployment, prompts, reference):
    answers = four_prompts(router.url, prompts, deployment)
    for ids, answer, expected in zip(prompts, answers, reference):
        assert answer == expected, (
            f"prompt of {len(ids)} tokens: PD {answer} != transformers {expected}\n{server_evidence(deployment)}")
    SERVED[deployment.prefill.config.pp_mode] = answers


def _assert_kv_idle(deployment: PdDeployment, bound_s: float = 60.0) -> None:
    assert_kv_idle(deployment.prefill, deployment.decode, bound_s=bound_s)


def test_32_concurrent_mixed_all_served_equal_transformers_kv_idle(router, deployment, greedy):
    check_mixed(deployment, router.url, greedy)


@pytest.mark.parametrize("where", ["unreachable-host", "closed-port"])
def test_bad_bootstrap_address_is_a_client_error(router, deployment, prompts, reference, where):
    """A client that names a bootstrap server nobody runs gets a 400 from the decode server
    (the plugin's guard; stock SGLang answers 500 after a failed handshake), and the pair keeps
    serving."""
    host, port = ("10.255.255.1", 8998) if where == "unreachable-host" else ("127.0.0.1", 1)
    payload = {"input_ids": prompts[-1], "bootstrap_host": host, "bootstrap_port": port,
               "bootstrap_room": random.Random(5).getrandbits(62),
               "sampling_params": {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}}
    status, body = post_status(deployment.decode.url + "/generate", payload, timeout=120)
    assert status == 400 and "unreachable" in body, f"decode answered {status}: {body[:500]}"
    assert generate(router.url, prompts[-1]) == reference[-1]
    _assert_kv_idle(deployment)


LONG_CHUNKS = -(-LONG_PROMPT // CHUNK)
IN_FLIGHT_AFTER_S = 2.0
KV_FREE_BOUND_S = 180.0
"""A prefill server whose decode peer died frees the request's KV within this."""
DISCONNECT_PROMPT = 6000
"""94 chunks: a server sees a client's disconnect only at its next check (every 4 s), by when a
lightly loaded host has run a few dozen chunks."""


def _prefill_batches_logged(deployment: PdDeployment) -> int:
    return prefill_batches_logged(deployment.prefill.log_path, PREFILL_PP)


def _wait_in_prefill(deployment: PdDeployment, logged_before: int, client=None) -> None:
    wait_in_prefill(deployment.prefill.log_path, PREFILL_PP, logged_before, client)


def _assert_prefill_stopped_early(deployment: PdDeployment, logged_before: int, what: str,
                                  chunks: int = LONG_CHUNKS) -> int:
    """After the KV is idle: fewer prefill batches were run than the prompt's ``chunks``, so the
    prefill server ended the request instead of prefilling it to the end."""
    _assert_kv_idle(deployment)
    run = _prefill_batches_logged(deployment) - logged_before
    assert run < chunks, (f"{what}: {run} prefill batches run for a {chunks}-chunk prompt, "
                          f"so its prefill ran on to the end; prefill log tail:\n"
                          f"{deployment.prefill.log_tail(3000)}")
    print(f"{what}: {run} prefill batches of {chunks} chunks")
    return run


def _payload(ids: list[int], new_tokens: int = NUM_NEW_TOKENS, **fields) -> dict:
    return {"input_ids": ids, **fields,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}


def _timed_post(url: str, payload: dict, timeout: float) -> tuple[int, str, float]:
    """(HTTP status, body, seconds); status -1 when the connection failed or timed out."""
    began = time.monotonic()
    try:
        status, body = post_status(url, payload, timeout)
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
        status, body = -1, repr(exc)
    return status, body, time.monotonic() - began


def _in_background(url: str, payload: dict, timeout: float = 300.0):
    """Post from a daemon thread; the returned future holds ``_timed_post``'s answer."""
    from concurrent.futures import Future

    future: Future = Future()
    threading.Thread(target=lambda: future.set_result(_timed_post(url, payload, timeout)), daemon=True).start()
    return future


def _assert_client_error(future, what: str, deployment: PdDeployment, bound_s: float = ERROR_BOUND_S) -> float:
    status, body, seconds = future.result(timeout=bound_s)
    failed = status < 0 or status >= 400 or '"abort"' in body
    assert failed, (f"{what}: the client got {status} (not an error) after {seconds:.1f} s: {body[:300]}\n"
                    f"prefill log tail:\n{deployment.prefill.log_tail(2000)}")
    return seconds


def _assert_still_serving(deployment: PdDeployment, prompts, reference) -> None:
    """KV back to 0 on both sides, then a request through the router served right."""
    _assert_kv_idle(deployment)
    assert generate(deployment.router.url, prompts[-1]) == reference[-1]
    _assert_kv_idle(deployment)


def test_abort_in_bootstrap_frees_the_prefill_kv(router, deployment, prompts, reference):
    """A request the decode side never hears of waits on the prefill server for its bootstrap
    (computed ahead, its KV held); ``/abort_request`` with its rid ends it: the client gets an
    error, the prefill frees its KV and keeps serving."""
    rid = f"pd-abort-bootstrap-{random.getrandbits(32):x}"
    payload = _payload(prompts[0], rid=rid, bootstrap_host="127.0.0.1", bootstrap_port=router.bootstrap_port,
                       bootstrap_room=random.getrandbits(62))
    client = _in_background(deployment.prefill.url + "/generate", payload)
    time.sleep(IN_FLIGHT_AFTER_S)
    assert not client.done(), f"served without a decode side: {client.result()}"
    status, body = post_status(deployment.prefill.url + "/abort_request", {"rid": rid}, timeout=30)
    assert status == 200, f"/abort_request answered {status}: {body[:300]}"
    _assert_client_error(client, "abort in bootstrap", deployment)
    _assert_still_serving(deployment, prompts, reference)


def test_abort_mid_transfer_frees_the_kv_on_both_sides(router, deployment, prompts, reference):
    """A long prompt through the router, aborted on both servers (what a client that gives up
    asks of each; the router has no abort of its own) while the prefill server computes and
    sends its KV chunk by chunk: the prefill stops before the prompt's end, the client gets an
    error, both sides free its KV, the pair keeps serving."""
    before = _prefill_batches_logged(deployment)
    client = _in_background(router.url + "/generate", _payload(make_prompts([LONG_PROMPT], 41)[0]))
    _wait_in_prefill(deployment, before, client)
    for server in (deployment.prefill, deployment.decode):
        status, body = post_status(server.url + "/abort_request", {"abort_all": True}, timeout=30)
        assert status == 200, f"/abort_request answered {status}: {body[:300]}"
    _assert_client_error(client, "abort mid-transfer", deployment)
    _assert_prefill_stopped_early(deployment, before, "abort mid-transfer")
    _assert_still_serving(deployment, prompts, reference)


def test_client_disconnect_from_the_router_ends_the_request(router, deployment, prompts, reference):
    """A client that closes its connection to the router mid-prefill: the router drops its
    requests to both servers, each server sees the disconnect and aborts; the prefill stops
    before the prompt's end, KV back to 0 on both sides, the pair keeps serving."""
    import http.client
    import socket

    before = _prefill_batches_logged(deployment)
    connection = http.client.HTTPConnection("127.0.0.1", router.port, timeout=ERROR_BOUND_S)
    connection.request("POST", "/generate", body=json.dumps(_payload(make_prompts([DISCONNECT_PROMPT], 42)[0])),
                       headers={"Content-Type": "application/json"})
    _wait_in_prefill(deployment, before)
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    _assert_prefill_stopped_early(deployment, before, "client disconnect", -(-DISCONNECT_PROMPT // CHUNK))
    _assert_still_serving(deployment, prompts, reference)


def test_decode_killed_mid_transfer_the_prefill_frees_the_kv_and_keeps_serving(router, deployment, prompts,
                                                                              reference):
    """kill -9 of the decode server while the prefill server sends a long prompt's KV: the
    client gets an error, the prefill server frees the request's KV and serves the next request
    (through a fresh decode server and router)."""
    before = _prefill_batches_logged(deployment)
    client = _in_background(router.url + "/generate", _payload(make_prompts([LONG_PROMPT], 43)[0]))
    _wait_in_prefill(deployment, before, client)
    os.killpg(deployment.decode.process.pid, signal.SIGKILL)
    seconds = _assert_client_error(client, "decode killed", deployment, KV_FREE_BOUND_S)
    began = time.monotonic()
    while (used := kv_tokens_in_use(deployment.prefill)) and time.monotonic() < began + KV_FREE_BOUND_S:
        time.sleep(0.2)
    assert used == 0, f"the prefill server still holds {used} KV tokens {KV_FREE_BOUND_S:.0f} s after the decode died"
    freed = time.monotonic() - began
    print(f"decode killed: client error after {seconds:.1f} s, prefill KV free {freed:.1f} s later, "
          f"{_prefill_batches_logged(deployment) - before} prefill batches of {LONG_CHUNKS} chunks")
    deployment.restart_decode()
    _assert_still_serving(deployment, prompts, reference)


def test_killed_prefill_rank_is_named_and_router_clients_get_an_error(router, deployment, prompts):
    """Last use of the prefill server: kill -9 of pp rank 1 while a long prompt is in prefill
    ends the server with one log line naming the rank; the client in flight and a request
    sent after get an error within a bound instead of hanging."""
    url = deployment.router.url
    in_flight = _in_background(url + "/generate", _payload(make_prompts([LONG_PROMPT], 44)[0]))
    _wait_in_prefill(deployment, _prefill_batches_logged(deployment), in_flight)
    assert_fault_ends_the_server(deployment.prefill, "pd-kill-prefill-rank1", signal.SIGKILL, 1, "idle",
                                 KILL_BOUND_S)
    seconds = _assert_client_error(in_flight, "prefill rank killed", deployment)
    status, body, after = _timed_post(url + "/generate", _payload(prompts[0], 2), timeout=120)
    assert status < 0 or status >= 400, f"router answered {status} with its prefill server gone: {body[:300]}"
    assert after < ERROR_BOUND_S, f"the router took {after:.0f} s to fail a request"
    print(f"prefill rank killed: in-flight client error after {seconds:.1f} s, next request {after:.1f} s")
    assert_kv_idle(deployment.decode)
