"""Helpers shared by the VPP server tests: prompts, the transformers oracle, request checks."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from sglang_harness import SGLangServer, all_admitted_left, get_json, kv_tokens_in_use, post_json, wait_for_json  # noqa: F401 (re-exported)
from sglang_vpp.models.tiny_hf import TinyModelSpec, load_transformers_model

CHUNK = 64
MIXED_LENGTHS = (37, 768, 64, 300, 5, 730, 128, 450)
"""1 to 12 chunks of 64; 64, 128 and 768 divide the chunk size, the others do not."""
NUM_NEW_TOKENS = 8
LOGPROB_TOLERANCE = 1e-4
"""Against transformers' whole-prompt fp32 forward (the issue's bound)."""

_WELL_CONDITIONED = {"initializer_range": 0.1}
"""The presets' 0.2 makes logits sharp enough that twelve 64-token chunks accumulate fp32 rounding
past 1e-4 in stock SGLang itself (stock ``--pp-mode cpp`` measured 1.13e-4 on a 730-token prompt;
transformers chunked-vs-whole 5.7e-5). At 0.1 transformers chunked-vs-whole is 1.3e-5, so a 1e-4
bound tests the pipeline, not the rounding, while greedy argmax stays decisive on these prompts."""
QWEN2_8L = TinyModelSpec("qwen2-tiny", num_layers=8, overrides=_WELL_CONDITIONED)
QWEN3_MOE = TinyModelSpec("qwen3-moe-tiny", overrides=_WELL_CONDITIONED)


def make_prompts(lengths, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 10000) for _ in range(n)] for n in lengths]


class Reference:
    """transformers' greedy tokens and prompt logprobs, computed once per (model, prompt)."""

    def __init__(self, tiny_model) -> None:
        self._tiny_model = tiny_model
        self._models: dict = {}
        self._cache: dict = {}

    def __call__(self, spec: TinyModelSpec, ids: list[int], num_new: int = NUM_NEW_TOKENS) -> dict:
        key = (spec, tuple(ids), num_new)
        if key not in self._cache:
            from transformers import GenerationConfig

            if spec not in self._models:
                self._models[spec] = load_transformers_model(self._tiny_model(spec))
            model = self._models[spec]
            config = GenerationConfig(max_new_tokens=num_new, do_sample=False, eos_token_id=None, pad_token_id=1)
            with torch.no_grad():
                generated = model.generate(torch.tensor([ids]), generation_config=config)
                logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            self._cache[key] = {
                "tokens": generated[0, len(ids):].tolist(),
                "prompt_logprobs": [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))],
            }
        return self._cache[key]


def generate(server: SGLangServer, ids: list[int], num_new: int = NUM_NEW_TOKENS, **extra) -> dict:
    payload = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": num_new, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        **extra,
    }
    return post_json(server.url + "/generate", payload, timeout=600)


def generate_concurrently(server: SGLangServer, prompts: list[list[int]]) -> list[dict]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: generate(server, ids), prompts))


def check_answer(answer: dict, ids: list[int], ref: dict, server: SGLangServer) -> None:
    assert answer["output_ids"] == ref["tokens"], (
        f"prompt of {len(ids)} tokens: {answer['output_ids']} != transformers {ref['tokens']}; "
        f"log tail:\n{server.log_tail(3000)}"
    )
    got = [entry[0] for entry in answer["meta_info"]["input_token_logprobs"]]
    assert len(got) == len(ids)
    if len(ids) > 1:
        diffs = [abs(a - b) for a, b in zip(got[1:], ref["prompt_logprobs"])]
        assert max(diffs) < LOGPROB_TOLERANCE, f"prompt of {len(ids)}: max |logprob diff| {max(diffs):.3g}"


def abort_mid_prefill(server: SGLangServer, num_tokens: int = 3000, in_prefill_tokens: int = 4 * CHUNK) -> dict:
    """Start a long prefill, abort it by rid while it runs (once ``in_prefill_tokens`` of its KV
    are in use: several chunks in the pipeline, most of the prompt still to come); returns the
    aborted answer."""
    ids = make_prompts((num_tokens,), seed=3)[0]
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(answer=generate(server, ids, 50, rid="vpp-abort-me")))
    thread.start()
    deadline = time.monotonic() + 60
    while kv_tokens_in_use(server) < in_prefill_tokens and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    assert thread.is_alive(), f"the {num_tokens}-token request ended before it was aborted: {result.get('answer')}"
    abort(server, "vpp-abort-me")
    thread.join(timeout=300)
    return result["answer"]


def abort(server: SGLangServer, rid: str) -> None:
    """SGLang's ``/abort_request`` for ``rid`` (every request whose rid starts with it)."""
    request = urllib.request.Request(
        server.url + "/abort_request", data=json.dumps({"rid": rid}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def abort_on_first_token(server: SGLangServer, ids: list[int], rid: str, num_new: int) -> dict:
    """Stream a request and abort it by rid as soon as its first token arrives (its prefill's
    result was just processed: the request now waits to decode, in a decode slot or held);
    returns the last streamed answer (its ``meta_info.finish_reason``)."""
    payload = {"input_ids": ids, "rid": rid, "stream": True,
               "sampling_params": {"temperature": 0, "max_new_tokens": num_new, "ignore_eos": True}}
    request = urllib.request.Request(server.url + "/generate", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    last: dict = {}
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            text = line.decode().strip()
            if not text.startswith("data:") or text == "data: [DONE]":
                continue
            if not last:
                abort(server, rid)
            last = json.loads(text[len("data:"):])
    return last


def load_then_wait_for_decisions(server: SGLangServer, num_ranks: int) -> None:
    """Concurrent prompts of different lengths (some chunked, some not), then a long prompt with a
    short one sent while the long one prefills; returns once every rank's records hold all of it."""
    prompts = make_prompts((300, 37, 520, 128), seed=21)
    assert all(len(answer["output_ids"]) == NUM_NEW_TOKENS for answer in generate_concurrently(server, prompts))
    long_ids, short_ids = make_prompts((760, 90), seed=22)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(answer=generate(server, long_ids, 2, rid="replay-long")))
    thread.start()
    deadline = time.monotonic() + 60
    while kv_tokens_in_use(server) == 0 and time.monotonic() < deadline:  # the long prefill has started
        time.sleep(0.01)
    generate(server, short_ids, 2, rid="replay-short")
    thread.join(timeout=300)
    assert len(result["answer"]["output_ids"]) == 2

    def holds_short(data: dict) -> bool:
        return any("replay-short" in rec.get("requests", ()) for rec in data.get("decisions", ()))

    leader = wait_for_json(server.trace_dir / "vpp_rank0.records.json", timeout=60, until=holds_short)
    last_seq = max(rec["seq"] for rec in leader["decisions"] if rec["kind"] == "admit")
    for rank in range(1, num_ranks):
        wait_for_json(server.trace_dir / f"vpp_rank{rank}.records.json", timeout=60,
                      until=lambda data: max((r["seq"] for r in data["records"]), default=-1) >= last_seq)


def tamper_one_admission(trace_dir: Path, out_dir: Path) -> None:
    """A copy of ``trace_dir`` whose rank 0 claims one ordinary admission was a packed one."""
    import shutil

    shutil.copytree(trace_dir, out_dir)
    path = out_dir / "vpp_rank0.records.json"
    data = json.loads(path.read_text())
    record = next(rec for rec in data["decisions"] if rec["kind"] == "admit" and rec["decision"] == "yes")
    record["decision"] = "packed"
    path.write_text(json.dumps(data))


def assert_reproduce_controls_fail(trace_dir: Path, out_dir: Path) -> None:
    """The negative controls of ``check --trace --reproduce`` on a real trace: two swapped compute
    records of rank 1 fail; a fold-back input delayed past a rank-0 pick between it and stage 0
    fails (when the trace holds such a pick)."""
    import shutil

    from sglang_vpp.serving.decision_replay import load_trace, recorded_layout
    from sglang_vpp.serving.reproduce import MeasuredTimings, reproduce_trace

    shutil.copytree(trace_dir, out_dir)
    path = out_dir / "vpp_rank1.records.json"
    data = json.loads(path.read_text())
    records = data["records"]
    first = next(i for i in range(1, len(records)) if (records[i]["stage"], records[i]["seq"]) !=
                 (records[0]["stage"], records[0]["seq"]) and records[i]["stage"] == records[0]["stage"])
    records[0], records[first] = records[first], records[0]
    path.write_text(json.dumps(data))
    swapped = reproduce_trace(out_dir)
    assert not swapped.ok and swapped.difference.rank == 1, swapped
    ranks = load_trace(trace_dir)
    last = recorded_layout(ranks[0]["controller"]).last_stage
    pick = next((d for d in ranks[0]["decisions"] if d["kind"] == "pick" and d["ready"][0][0] == last
                 and d["ready"][1][0] == 0), None)
    if pick is not None:
        timings = MeasuredTimings(ranks)
        timings.edit_duration(1, last - 1, pick["ready"][0][1], 1.0)
        assert not reproduce_trace(trace_dir, timings).ok


def greedy_tokens_checked(server: SGLangServer, spec: TinyModelSpec, reference: Reference, lengths, seed: int) -> list:
    """Send prompts of ``lengths`` concurrently, check each against transformers, return the tokens."""
    prompts = make_prompts(lengths, seed=seed)
    answers = generate_concurrently(server, prompts)
    for ids, answer in zip(prompts, answers):
        check_answer(answer, ids, reference(spec, ids), server)
    return [answer["output_ids"] for answer in answers]


ANSWER_REGEX = r"(yes|no|maybe) [0-9]{3}"
CODE_EBNF = 'root ::= "x" [0-9] [0-9]'
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"]}


def constrained_tokens_checked(server: SGLangServer, seed: int, logs=None) -> list[list[int]]:
    """Constrained decoding (SGLang's grammar queue) on prompts longer than the chunk. First a
    JSON-schema request alone, on a server with nothing to do: its grammar compiles after the
    loop's first scheduling turn has found it not ready (``GRAMMAR_POLL_ENV`` makes that turn
    short), so the loop must keep polling instead of waiting for a next request. Then five at
    once: two regex, a free, a JSON-schema and an EBNF request. Checks each bounded grammar's
    answer matches it whole and ended on it; returns the five answers' tokens (a JSON schema lets
    a tiny model pad with whitespace, so only its start is checked here: equality with stock cpp,
    where a test has it, checks the rest). ``logs``: what a failure prints the log tail of
    (default ``server``; a router's own log says little)."""
    import re
    import uuid

    lone_ids, *prompts = make_prompts((60, 150, 37, 90, 20, 70), seed=seed)
    json_params = {"max_new_tokens": 24, "temperature": 0, "json_schema": json.dumps(SCHEMA)}
    # A title SGLang has not compiled yet: on a server used before, a cached grammar is ready at once.
    lone_params = {**json_params, "json_schema": json.dumps({**SCHEMA, "title": f"lone-{uuid.uuid4().hex}"})}

    def send(ids: list[int], params: dict, timeout: float = 600) -> dict:
        return post_json(server.url + "/generate", {"input_ids": ids, "sampling_params": params}, timeout=timeout)

    lone = send(lone_ids, lone_params, timeout=60)
    params = [
        {"max_new_tokens": 16, "temperature": 0, "regex": ANSWER_REGEX},
        {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        json_params,
        {"max_new_tokens": 8, "temperature": 0, "ebnf": CODE_EBNF},
        {"max_new_tokens": 16, "temperature": 0, "regex": ANSWER_REGEX},
    ]
    with ThreadPoolExecutor(len(prompts)) as pool:  # one request each: a router takes no batch of params
        answers = [*pool.map(send, prompts, params), lone]
    tail = (logs or server).log_tail(3000)
    for i, pattern in ((0, ANSWER_REGEX), (3, r"x[0-9][0-9]"), (4, ANSWER_REGEX)):
        text, finish = answers[i]["text"], answers[i]["meta_info"]["finish_reason"]["type"]
        assert re.fullmatch(pattern, text) and finish == "stop", f"answer {i}: {text!r} ({finish}); log tail:\n{tail}"
    for i in (2, 5):
        assert answers[i]["text"].lstrip().startswith("{"), f"JSON answer {i}: {answers[i]['text']!r}"
    assert len(answers[1]["output_ids"]) == 8
    return [answer["output_ids"] for answer in answers[:-1]]  # the lone one's schema differs per call


GRAMMAR_POLL_ENV = (("SGLANG_GRAMMAR_POLL_INTERVAL", "0.00002"), ("SGLANG_GRAMMAR_MAX_POLL_ITERATIONS", "1000000"))
"""SGLang polls a compiling grammar this long per scheduling call: 20 us, so a tiny model's
grammar is still compiling when the loop's first turn over the slots ends
(``constrained_tokens_checked``); at SGLang's 5 ms default, and at 0.2 ms, it has compiled by
then. SGLang's poll count before it gives a grammar up is raised 100-fold, so that still takes
over 20 s."""
