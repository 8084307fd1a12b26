"""Bad inputs get a 400 and the server keeps serving; 32 mixed requests under load all end.

One pp 2 server per mode (vpp-pack, stock cpp with the plugin loaded), shared by every test of
that mode (module-scoped fixture: pytest groups the tests per server).

- Input guard: the three crashing inputs (empty text, id >= vocab, id -1) and their relatives
  on /generate, /v1/completions and /v1/chat/completions, single and batch, and the logprob
  option that crashes the sampler (top_logprobs_num outside [0, vocab]), token_ids_logprob ids
  outside the vocabulary (refused by SGLang itself) and return_hidden_states under PP; after each refusal
  the same server answers a valid request.
- Abort mid-prefill and a client that leaves, with two long prompts queued behind a short one
  (under vpp-pack one of them is packed into the short one's drain window; the test checks it).
- KV pool exhausted in decode: six long prompts need more KV than the pool holds; every request
  is served in full (retracted and resumed, none aborted) with the same greedy ids under both.
- Load: 32 requests (prompt 20-600 tokens) with 16 in flight, every 4th streamed, every 8th
  aborted through /abort_request; every request ends (answered or aborted, none hangs), the KV
  pool returns to idle, and a fixed greedy batch afterwards gives the same ids under vpp-pack
  as under cpp.
- Last, the vpp-pack server's end: kill -9 of rank 0 mid-prefill takes the server down fast and
  is named (test_faults.py's check, on a server that is no longer needed instead of a new one).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fault_driver import KILL_BOUND_S, assert_fault_ends_the_server
from sglang_harness import (SKIP_NO_SGLANG, ServerConfig, SGLangServer, assert_kv_idle, kv_tokens_in_use, post_json,
                            wait_for_json)

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

MODES = ("vpp-pack", "cpp")  # cpp last: test_server_generate, next, starts with the same server
VOCAB = 12000  # TinyModelSpec's default vocabulary (checked against config.json below)

# (case id, path, payload, text the 400 message must contain; None where SGLang's own request
# validation refuses first, in its words)
BAD_INPUTS = [
    ("generate-empty-text", "/generate", {"text": ""}, "no tokens"),
    ("generate-empty-ids", "/generate", {"input_ids": []}, None),
    ("generate-id-vocab", "/generate", {"input_ids": [5, VOCAB]}, f"[0, {VOCAB})"),
    ("generate-id-large", "/generate", {"input_ids": [20000]}, f"[0, {VOCAB})"),
    ("generate-id-minus-one", "/generate", {"input_ids": [-1, 5]}, f"[0, {VOCAB})"),
    ("generate-id-not-int", "/generate", {"input_ids": [5, "7"]}, None),
    ("generate-batch-ids-one-bad", "/generate", {"input_ids": [[5, 6, 7], [8, VOCAB + 3]]}, f"[0, {VOCAB})"),
    ("generate-batch-ids-one-empty", "/generate", {"input_ids": [[5, 6], []]}, "no tokens"),
    ("generate-ids-nested-too-deep", "/generate", {"input_ids": [[[5, 6]]]}, None),
    ("generate-batch-text-one-empty", "/generate", {"text": ["def f():", ""]}, "no tokens"),
    ("generate-stream-empty-text", "/generate", {"text": "", "stream": True}, "no tokens"),
    ("completions-empty", "/v1/completions", {"prompt": ""}, None),
    ("completions-id-vocab", "/v1/completions", {"prompt": [VOCAB]}, f"[0, {VOCAB})"),
    ("completions-id-minus-one", "/v1/completions", {"prompt": [-1]}, f"[0, {VOCAB})"),
    ("completions-batch-one-bad", "/v1/completions", {"prompt": [[5, 6], [20000]]}, f"[0, {VOCAB})"),
    ("completions-batch-text-one-empty", "/v1/completions", {"prompt": ["import os", ""]}, "no tokens"),
    ("completions-stream-id-vocab", "/v1/completions", {"prompt": [VOCAB], "stream": True}, f"[0, {VOCAB})"),
    # Logprob options the sampler cannot serve (stock SGLang's scheduler dies on each).
    ("generate-top-logprobs-over-vocab", "/generate", {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": VOCAB + 1}, f"[0, {VOCAB}]"),
    ("generate-top-logprobs-negative", "/generate", {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": -1}, "got -1"),
    ("generate-batch-top-logprobs-one-bad", "/generate", {"input_ids": [[5, 6], [7, 8]], "return_logprob": True, "top_logprobs_num": [2, VOCAB + 1]}, "top_logprobs_num"),
    # SGLang's own check (the guard leaves it alone): still a 400 and a server that keeps serving.
    ("generate-token-ids-logprob-vocab", "/generate", {"input_ids": [5, 6], "return_logprob": True, "token_ids_logprob": [5, VOCAB]}, "out-of-vocabulary token id"),
    ("completions-logprobs-over-vocab", "/v1/completions", {"prompt": [5, 6], "logprobs": VOCAB + 1}, "top_logprobs_num"),
    # Hidden states under PP (every rank without the last stage dies on them; these servers run
    # without --enable-return-hidden-states, so this checks that the guard answers first).
    ("generate-hidden-states-under-pp", "/generate", {"input_ids": [5, 6], "return_hidden_states": True}, "--pp-size 2"),
    ("chat-top-logprobs-over-vocab", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": VOCAB + 1}, "top_logprobs_num"),
]  # fmt: skip

GOOD_GENERATE = {"input_ids": [11, 12, 13, 14], "sampling_params": {"temperature": 0, "max_new_tokens": 4}}


def _post(url: str, payload: dict[str, Any], timeout: float = 120.0) -> tuple[int, str]:
    """(status, body) without raising on HTTP errors."""
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _with_model_fields(path: str, payload: dict[str, Any]) -> dict[str, Any]:
    payload = dict(payload)
    if path.startswith("/v1/"):
        payload.setdefault("model", "default")
        payload.setdefault("max_tokens", 4)
        payload.setdefault("temperature", 0)
    else:
        payload.setdefault("sampling_params", {"temperature": 0, "max_new_tokens": 4})
    return payload


@pytest.fixture(scope="module", params=MODES, ids=[f"pp2-{mode}" for mode in MODES])
def server(request, server_pool, tiny_model_dir: Path, tmp_path_factory) -> SGLangServer:
    config_json = json.loads((tiny_model_dir / "config.json").read_text())
    assert config_json["vocab_size"] == VOCAB
    # vpp-pack writes its decisions (to check that it packed); cpp's config stays the one
    # test_server_generate.py starts, so that server is shared.
    trace_dir = tmp_path_factory.mktemp(f"trace-{request.param}") if request.param != "cpp" else None
    config = ServerConfig(model_dir=str(tiny_model_dir), pp_size=2, pp_mode=request.param, chunked_prefill_size=64,
                          extra_args=("--vpp-trace", str(trace_dir)) if trace_dir else ())
    server = server_pool.get(config, timeout=400)
    server.trace_dir = trace_dir
    return server


def _check_against_the_other_mode(request, store: dict, mode: str, outputs) -> None:
    """Record ``outputs`` for ``mode``; the mode that runs second compares. Each test of the pair
    checks at its start (``_require_both_modes``) that the other is selected: a ``-k`` that
    deselects one mode must not silently drop the cross-mode check."""
    store[mode] = outputs
    runs = _selected_runs(request)
    if runs.index(mode) == len(runs) - 1:
        missing = [m for m in runs if m not in store]
        assert not missing, f"{missing} ran earlier in this session but recorded no outputs (it failed)"
        assert store["vpp-pack"] == store["cpp"]


def _selected_runs(request) -> list[str]:
    """The modes this test runs under in this session, in run order."""
    name = request.node.originalname
    return [item.callspec.params["server"] for item in request.session.items
            if getattr(item, "originalname", None) == name and getattr(item, "module", None) is request.node.module]


def _require_both_modes(request) -> None:
    missing = sorted(set(MODES) - set(_selected_runs(request)))
    if missing:
        pytest.fail(f"this test compares {' and '.join(MODES)}; the selection dropped {', '.join(missing)}: "
                    "select both (e.g. -k 'test_load_all_end')", pytrace=False)


def _assert_still_serving(server: SGLangServer) -> None:
    assert server.process is not None and server.process.poll() is None, server.log_tail()
    out = post_json(server.url + "/generate", GOOD_GENERATE, timeout=120)
    assert len(out["output_ids"]) == 4


@pytest.mark.parametrize("name,path,payload,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_refused_and_the_server_keeps_serving(server, name, path, payload, message):
    status, body = _post(server.url + path, _with_model_fields(path, payload))
    if payload.get("stream") and status == 200:
        # Once streaming has begun SGLang reports a refusal as an SSE error event.
        assert '"error"' in body and (message or "") in body, body[:2000]
    else:
        assert status == 400, f"{name}: {status} {body[:2000]}"
        assert (message or "") in body, body[:2000]
    _assert_still_serving(server)


def test_chat_without_content_is_answered(server):
    """An empty chat still has template tokens: served, or refused with 400, never a crash."""
    for messages in ([{"role": "user", "content": ""}], []):
        status, body = _post(
            server.url + "/v1/chat/completions",
            {"model": "default", "messages": messages, "max_tokens": 4, "temperature": 0},
        )
        assert status in (200, 400), f"{messages}: {status} {body[:2000]}"
    _assert_still_serving(server)


NUM_LOAD_REQUESTS = 32
"""Twice ``NUM_IN_FLIGHT``: new requests keep arriving while others end; every 8th is aborted."""
NUM_IN_FLIGHT = 16
SAMPLE_PROMPTS = [[(13 * i + 7 * k) % 11000 + 2 for k in range(length)] for i, length in enumerate((30, 170, 333))]
_samples: dict[str, list[list[int]]] = {}


def _load_request(server: SGLangServer, index: int, prompt: list[int]) -> str:
    """One request of the load; returns how it ended ('answered', 'aborted')."""
    payload = {
        "input_ids": prompt,
        "rid": f"load-{index}",
        "sampling_params": {"temperature": 0, "max_new_tokens": 8 + index % 9, "ignore_eos": True},
        "stream": index % 4 == 0,
    }
    if index % 8 == 3:
        timer = threading.Timer(0.2, _post, args=(server.url + "/abort_request", {"rid": f"load-{index}"}))
        timer.start()
    status, body = _post(server.url + "/generate", payload, timeout=300)
    assert status == 200, f"request {index}: {status} {body[:1000]}"
    last = [line for line in body.splitlines() if line.startswith("data: {")][-1][6:] if payload["stream"] else body
    finish = json.loads(last)["meta_info"]["finish_reason"] or {}
    if finish.get("type") == "abort":
        assert index % 8 == 3, f"request {index} aborted without being asked: {finish}"
        return "aborted"
    assert finish.get("type") == "length", f"request {index}: {finish}"
    return "answered"


def test_load_all_end_kv_idle_and_greedy_equal_to_cpp(server, request):
    _require_both_modes(request)
    rng = random.Random(7)
    prompts = [[rng.randrange(2, 11000) for _ in range(rng.randrange(20, 600))] for _ in range(NUM_LOAD_REQUESTS)]
    with ThreadPoolExecutor(NUM_IN_FLIGHT) as pool:
        outcomes = list(pool.map(lambda item: _load_request(server, *item), enumerate(prompts)))
    assert outcomes.count("answered") >= NUM_LOAD_REQUESTS - NUM_LOAD_REQUESTS // 8, outcomes
    assert_kv_idle(server)
    out = post_json(
        server.url + "/generate",
        {"input_ids": SAMPLE_PROMPTS, "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}},
    )
    _check_against_the_other_mode(request, _samples, server.config.pp_mode, [item["output_ids"] for item in out])


def _disconnect_when(url: str, payload: dict[str, Any], leave: threading.Event) -> None:
    """Send a streamed request and close the connection once ``leave`` is set (a client that leaves)."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/generate", json.dumps(payload), {"Content-Type": "application/json"})
    response = connection.getresponse()
    leave.wait(timeout=300)
    response.close()
    connection.close()


CHUNK = 64  # the servers' --chunked-prefill-size
# Ids below 11002 start every other prompt of this module ((x % 11000) + 2, randrange(2, 11000),
# the chat template and texts); the abort test's prompts start at this one, so none hits the
# prefix cache.
_UNCACHED_FIRST_ID = 11990


def test_abort_and_disconnect_mid_prefill_while_packing(server):
    """A 30-chunk prompt, then two 39-chunk prompts that queue behind it (whole chunks, so no
    partial last chunk lets the next request join a micro-batch: vpp-pack packs the next one's
    first chunks into the first one's drain window). Once the second holds KV for two chunks it
    is aborted mid-prefill and the third's client leaves (queued or prefilling); the first is
    answered, KV returns to idle, the server keeps serving, and under vpp-pack one of them was
    packed.

    The server has served earlier tests' prompts: a prefix-cache hit of even one token shifts the
    chunk boundaries, the first prompt's last chunk is partial, the second request fills it and
    the two form one chain with no drain window (nothing to pack, rightly). So every prompt here
    starts with an id no other prompt of this module starts with (see ``_UNCACHED_FIRST_ID``)."""
    # The first prompt is long enough to be still in prefill when the others arrive 0.3 s later
    # on an idle host (at 10 chunks it could finish first, leaving no drain window to pack into).
    lengths = (30 * CHUNK, 39 * CHUNK, 39 * CHUNK)
    kept_ids, *long_ids = [[_UNCACHED_FIRST_ID + i] + [(31 * i + 11 * k) % 11000 + 2 for k in range(1, n)]
                           for i, n in enumerate(lengths)]
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    rids = ("mid-prefill-kept", "mid-prefill-abort", "mid-prefill-left")
    kept = {"input_ids": kept_ids, "rid": rids[0], "sampling_params": params}
    aborted = {"input_ids": long_ids[0], "rid": rids[1], "sampling_params": params}
    left = {"input_ids": long_ids[1], "rid": rids[2], "sampling_params": params, "stream": True}
    leave = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        kept_reply = pool.submit(_post, server.url + "/generate", kept)
        time.sleep(0.3)  # the short prompt is admitted first; the long ones queue behind it
        abort_reply = pool.submit(_post, server.url + "/generate", aborted)
        gone = pool.submit(_disconnect_when, server.url, left, leave)
        try:
            # SGLang runs queued prefill before decode, so the short prompt's answer would come
            # only after the second's whole prefill: watch KV instead.
            deadline = time.monotonic() + 120
            while kv_tokens_in_use(server) < lengths[0] + 2 * CHUNK and time.monotonic() < deadline:
                time.sleep(0.01)
            _post(server.url + "/abort_request", {"rid": rids[1]})
        finally:
            leave.set()
        status, body = abort_reply.result(timeout=300)
        assert status == 200 and json.loads(body)["meta_info"]["finish_reason"]["type"] == "abort", body[:1000]
        status, body = kept_reply.result(timeout=300)
        assert status == 200 and len(json.loads(body)["output_ids"]) == 4, body[:1000]
        gone.result(timeout=300)
    assert_kv_idle(server)
    _assert_still_serving(server)
    if server.trace_dir is not None:  # vpp-pack: a queued request entered the drain window
        _assert_packed_one_of(server.trace_dir / "vpp_rank0.records.json", rids)


def _assert_packed_one_of(records: Path, rids: tuple[str, ...]) -> None:
    """One of ``rids`` was admitted as packed; else fail with their micro-batches (where each
    request's prefill started, which requests shared one), the cause to look at."""

    def packed_here(data: dict) -> bool:
        return any(rec["kind"] == "admit" and rec["decision"] == "packed" and set(rec["requests"]) & set(rids)
                   for rec in data["decisions"])

    try:
        wait_for_json(records, timeout=60, until=packed_here)
    except AssertionError as exc:
        data = json.loads(records.read_text()) if records.exists() else {"decisions": []}
        mine = [(rec["seq"], rec["requests"], rec["start"], rec["tokens"], rec["decision"])
                for rec in data["decisions"] if rec["kind"] == "admit" and set(rec["requests"]) & set(rids)]
        raise AssertionError(f"{exc}; admitted (seq, requests, start, tokens, decision): {mine[:3]} ... "
                             f"{[m for m in mine if len(m[1]) > 1 or m[2] < CHUNK]}") from None


KV_PRESSURE_PROMPTS = [[(17 * i + 5 * k) % 11000 + 2 for k in range(2650)] for i in range(6)]
_kv_pressure: dict[str, list[list[int]]] = {}


def test_kv_pool_exhausted_in_decode_every_request_is_served_and_equal_to_cpp(server, request):
    """Six 2650-token prompts with 120 new tokens each need more KV (16620 tokens) than the
    pool holds (--max-total-tokens 16384): SGLang retracts decode requests and serves them
    later. A VPP decode slot's last request must be retracted too, never aborted (500), while
    others hold KV. Every request is answered in full, the same greedy ids as cpp."""
    _require_both_modes(request)
    params = {"temperature": 0, "max_new_tokens": 120, "ignore_eos": True}
    with ThreadPoolExecutor(len(KV_PRESSURE_PROMPTS)) as pool:
        replies = list(pool.map(lambda ids: _post(server.url + "/generate", {"input_ids": ids, "sampling_params": params},
                                                  timeout=600), KV_PRESSURE_PROMPTS))
    for status, body in replies:
        assert status == 200, f"{status} {body[:1000]}"
    outputs = [json.loads(body)["output_ids"] for _, body in replies]
    assert all(len(ids) == 120 for ids in outputs)
    assert_kv_idle(server)
    # The load reached retraction. VPP decodes in stock PP's count of slots (the controller's
    # decode slots), so whether a slot is left with one request depends on the order of the
    # retractions; the hook's own case is unit-tested (test_vpp_units.py).
    log = server.log_path.read_text(errors="replace")
    assert "KV cache pool is full. Retract requests." in log or "retracted instead of aborted" in log
    _check_against_the_other_mode(request, _kv_pressure, server.config.pp_mode, outputs)


# Only the vpp-pack server (its last test; cpp's server goes on to test_server_generate.py).
@pytest.mark.parametrize("server", ["vpp-pack"], indirect=True, ids=["pp2-vpp-pack"])
def test_killed_rank0_mid_prefill_ends_the_server_and_is_named(server):
    assert_fault_ends_the_server(server, "vpp-pack-kill-rank0-prefill", signal.SIGKILL, 0, "prefill", KILL_BOUND_S)
