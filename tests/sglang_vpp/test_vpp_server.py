"""``--pp-mode vpp | vpp-async | vpp-pack | vpp-taper | vpp-stream`` at --pp-size 2 serve real requests like
stock SGLang.

One server per mode (module-scoped, parametrised; the pool holds one at a time). An 8-layer tiny
Qwen2 gives 4 virtual stages of 2 layers. Chunk size 64; 8 concurrent prompts of 1 to 12 chunks,
lengths that divide the chunk size and lengths that do not (``vpp_checks.MIXED_LENGTHS``).
vpp-taper runs with chunk size 128, the smallest at which its ramps cut chunks (64 tokens, its
alignment) that differ from the body size.
Oracle: transformers' greedy ``generate`` and prompt logprobs (tokens equal, logprobs within
1e-4). --pp-size 4 and DeepSeek-V2: test_vpp_models.py; MoE/MLA at TP2 x PP2 and over two
nodes against stock cpp: test_vpp_deploy_matrix.py.
The vpp-pack server starts with the SIGSTOP cases' ``--vpp-comm-timeout`` and ends with one
(tests/sglang/test_faults.py's check, on a server no longer needed instead of a new one): SIGSTOP
of rank 1 in decode takes it down fast and is named.
"""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from fault_driver import STOP_BOUND_S, STOP_COMM_TIMEOUT_S, assert_fault_ends_the_server
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, assert_kv_idle, post_json
from vpp_checks import (
    CHUNK,
    GRAMMAR_POLL_ENV,
    MIXED_LENGTHS,
    NUM_NEW_TOKENS,
    QWEN2_8L,
    Reference,
    abort_mid_prefill,
    abort_on_first_token,
    all_admitted_left,
    assert_reproduce_controls_fail,
    check_answer,
    constrained_tokens_checked,
    generate,
    generate_concurrently,
    load_then_wait_for_decisions,
    make_prompts,
    tamper_one_admission,
    wait_for_json,
)
from order_checks import assert_planner_order_equals_the_server
from typer.testing import CliRunner

from sglang_vpp.cli.app import app

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

MODES = ("vpp", "vpp-async", "vpp-pack", "vpp-taper", "vpp-stream")
TAPER_CHUNK = 2 * CHUNK


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=MODES, ids=MODES)
def server(request, server_pool, tiny_model, tmp_path_factory):
    trace_dir = tmp_path_factory.mktemp(f"trace-{request.param}")
    stop_case = ("--vpp-comm-timeout", str(STOP_COMM_TIMEOUT_S)) if request.param == "vpp-pack" else ()
    config = ServerConfig(
        model_dir=str(tiny_model(QWEN2_8L)), pp_size=2, pp_mode=request.param,
        chunked_prefill_size=TAPER_CHUNK if request.param == "vpp-taper" else CHUNK,
        extra_args=("--vpp-trace", str(trace_dir), *stop_case), extra_env=GRAMMAR_POLL_ENV,
    )
    server = server_pool.get(config, timeout=300)
    server.trace_dir = Path(trace_dir)
    return server


def test_the_launcher_turns_graph_capture_off(server):
    """SGLang captures decode graphs by default off the CPU; a VPP rank runs each stage as its own
    forward, so the launcher switches capture off (validate.turn_graph_capture_off) and says so."""
    assert (f"sglang-vpp: --pp-mode {server.config.pp_mode} runs each virtual stage as its own forward: "
            "--cuda-graph-backend-decode disabled, --cuda-graph-backend-prefill disabled") in server.log_tail(10**7)


def test_concurrent_mixed_prompts_equal_transformers(server, reference):
    prompts = make_prompts(MIXED_LENGTHS, seed=11)
    for ids, answer in zip(prompts, generate_concurrently(server, prompts)):
        check_answer(answer, ids, reference(QWEN2_8L, ids), server)


def test_prefix_cache_hits_equal_transformers(server, reference):
    """The radix cache under VPP: a long prompt sent twice and two prompts sharing its prefix, at
    once (a chunk's KV enters the tree when the next chunk is scheduled, before rank 0 has run
    that chunk's last stage), then again once they are cached, and prompts of 1 and 2 tokens.
    No prompt logprobs: SGLang does not reuse cached KV for the tokens it must return them for."""
    # Seeds no other test of the module uses: a prompt cached here must not be a prefix of theirs.
    base, *tails = make_prompts((6 * CHUNK + 5, 30, CHUNK + 11), seed=41)
    prompts = [base, base, base + tails[0], base + tails[1], *make_prompts((1, 2), seed=42)]
    cached = 0
    for _ in range(2):
        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda ids: generate(server, ids, return_logprob=False), prompts))
        for ids, answer in zip(prompts, answers):
            expected = reference(QWEN2_8L, ids)["tokens"]
            assert answer["output_ids"] == expected, (len(ids), answer["output_ids"], expected)
            cached += answer["meta_info"]["cached_tokens"]
    assert cached >= len(base), f"no prompt hit the radix cache ({cached} cached tokens)"


def test_constrained_decoding_follows_each_grammar(server):
    """Requests waiting on their grammar: rank 0's readiness decision reaches the followers with
    its scheduling events (vpp/grammar_sync.py), not through stock PP's lockstep send, which
    hung a VPP server. Against stock cpp's tokens: test_vpp_deploy_matrix.py and test_vpp_models.py
    (other models)."""
    constrained_tokens_checked(server, seed=53)


def test_weights_reloaded_from_disk_serve_the_new_models_tokens(server, reference, tiny_model):
    """``/update_weights_from_disk`` (an RL trainer's reload) under VPP: every rank reloads only
    the layers of its own two stages (vpp/ownership.py), then serves the new model's tokens; and
    back. The prompts are their own, so no cached prefix of another test's answers them."""
    other = replace(QWEN2_8L, seed=QWEN2_8L.seed + 1)
    prompts = make_prompts((CHUNK + 3, 3 * CHUNK), seed=57)
    try:
        for spec in (other, QWEN2_8L):
            _reload_weights(server, tiny_model(spec))
            for ids, answer in zip(prompts, generate_concurrently(server, prompts)):
                check_answer(answer, ids, reference(spec, ids), server)
    finally:  # the module's other tests read the server's own weights
        _reload_weights(server, tiny_model(QWEN2_8L))


def _reload_weights(server, model_path: Path, idle_within_s: float = 30.0) -> None:
    """A trainer's reload right after its last answers. SGLang loads the weights, then flushes
    the cache only if no rank holds a request: a rank still finishing the last ones (under VPP
    a follower replays rank 0's events a V after rank 0 answered) makes the call fail (400, the
    weights loaded). As SGLang's answer says, the trainer then flushes again once the server is
    idle; a server that does not get idle within ``idle_within_s`` fails the test."""
    try:
        reply = post_json(f"{server.url}/update_weights_from_disk", {"model_path": str(model_path)}, timeout=300)
        assert reply["success"], reply
        return
    except RuntimeError as error:
        if "cache was not flushed" not in str(error):
            raise
    deadline = time.monotonic() + idle_within_s
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{server.url}/flush_cache", method="POST"),
                                        timeout=30):
                return
        except urllib.error.HTTPError as refused:
            if time.monotonic() > deadline:
                raise AssertionError(f"the server held requests {idle_within_s:.0f} s after the last answer: "
                                     f"/flush_cache -> {refused.code}") from refused
        time.sleep(0.1)


def _waiting_behind_a_long_request(server, seed: int) -> None:
    long_ids, *waiting = make_prompts((12 * CHUNK, 2 * CHUNK, 4 * CHUNK), seed=seed)
    with ThreadPoolExecutor(1 + len(waiting)) as pool:
        first = pool.submit(generate, server, long_ids)
        time.sleep(0.3)  # the long request is admitted first; the others queue behind it
        rest = [pool.submit(generate, server, ids) for ids in waiting]
        for future in (first, *rest):
            assert len(future.result(timeout=600)["output_ids"]) == NUM_NEW_TOKENS


def test_accounting_written_and_packing_exercised(server):
    packing = server.config.pp_mode in ("vpp-pack", "vpp-taper")
    leader_path = server.trace_dir / "vpp_rank0.records.json"
    records = wait_for_json(leader_path, until=all_admitted_left)
    # Whether the mixed load packs depends on when SGLang forms its batches: a request whose last
    # chunk is partial lets the next request join that micro-batch, and then no drain window is
    # left to pack. So a packing mode that did not pack gets a load made for it: a long request of
    # whole chunks, and whole-chunk requests that arrive while it is in flight and wait at the
    # barrier. A non-packing mode must not pack on any load.
    for round_seed in range(3):
        if not packing or records["counters"].get("num_packed", 0) > 0:
            break
        before = sum(rec["kind"] == "admit" for rec in records["decisions"])
        _waiting_behind_a_long_request(server, seed=100 + round_seed)
        records = wait_for_json(leader_path, until=lambda d: all_admitted_left(d) and sum(
            rec["kind"] == "admit" for rec in d["decisions"]) > before)
    follower = wait_for_json(server.trace_dir / "vpp_rank1.records.json")
    assert records["summary"]["num_computes"] > 0 and follower["summary"]["num_computes"] > 0
    stages0 = {r["stage"] for r in records["records"]}
    stages1 = {r["stage"] for r in follower["records"]}
    assert stages0 == {0, 3} and stages1 == {1, 2}, (stages0, stages1)
    assert (server.trace_dir / "vpp_rank0.json").exists()
    admitted = [rec for rec in records["decisions"] if rec["kind"] == "admit"]
    packed = [rec for rec in admitted if rec["decision"] == "packed"]
    assert records["counters"].get("num_packed", 0) == len(packed)  # extra-slot admissions only
    if not packing:
        assert not packed, f"{server.config.pp_mode} packed micro-batches {packed}"
        return
    assert packed, f"no micro-batch was packed: {records['counters']}"
    # A packed micro-batch enters stage 0 while an earlier request's micro-batch is still in flight.
    first = packed[0]["seq"]
    order = [(rec["kind"], rec["seq"]) for rec in records["decisions"] if rec["kind"] in ("admit", "left")]
    position = order.index(("admit", first))
    left_before = {seq for kind, seq in order[:position] if kind == "left"}
    earlier_prefill = {rec["seq"] for rec in admitted if rec["prefill"] and rec["seq"] < first
                       and not set(rec["requests"]) & set(packed[0]["requests"])}
    assert earlier_prefill - left_before, "the packed micro-batch started after every earlier request had left"


def test_server_decisions_replay_through_the_controller(server, tmp_path):
    load_then_wait_for_decisions(server, num_ranks=2)
    replay = CliRunner().invoke(app, ["check", "--trace", str(server.trace_dir)])
    assert replay.exit_code == 0, replay.output
    assert "the server followed the controller" in replay.output
    reproduced = CliRunner().invoke(app, ["check", "--trace", str(server.trace_dir), "--reproduce"])
    assert reproduced.exit_code == 0, reproduced.output
    assert "reproduced record by record" in reproduced.output
    print(reproduced.output)  # records compared per rank (pytest -rP)
    assert_reproduce_controls_fail(server.trace_dir, tmp_path / "controls")
    tamper_one_admission(server.trace_dir, tmp_path / "tampered")
    tampered = CliRunner().invoke(app, ["check", "--trace", str(tmp_path / "tampered")])
    assert tampered.exit_code == 1, tampered.output
    assert "DIVERGENCE at rank 0" in tampered.output and "expected admit, server did admit as packed" in tampered.output


def test_simulator_and_runtime_planner_order_equals_the_server(server, tmp_path, monkeypatch):
    if server.config.pp_mode == "vpp-taper":
        pytest.skip("the replanner rebuilds fixed-chunk workloads only; vpp-taper's cuts are checked "
                    "against the planner's in test_vpp_taper_serves_the_planned_chunks_through_the_openai_api")
    assert_planner_order_equals_the_server(server, 2, tmp_path, monkeypatch)


def test_abort_mid_prefill_frees_kv_on_every_rank(server, reference):
    if server.config.pp_mode == "vpp-async":
        pytest.skip("abort is exercised on the blocking (vpp) and the packing (vpp-pack) loops")
    answer = abort_mid_prefill(server)
    assert answer["meta_info"]["finish_reason"]["type"] == "abort"
    assert_kv_idle(server, bound_s=30)
    # Followers replay the same frees; SGLang's idle leak check (strict by default) ends the
    # server on any rank with leaked KV, so it must still be alive and answering.
    assert len(generate(server, make_prompts((100,), seed=5)[0], 2)["output_ids"]) == 2
    assert server.process is not None and server.process.poll() is None
    if server.config.pp_mode == "vpp":
        _abort_while_held(server, reference)


def test_client_request_shapes_equal_transformers(server, reference):
    """Request shapes the other tests send one at a time: a batch of prompts in one /generate
    (1 token, the chunk, chunk + 1), ``n`` > 1 on a prompt of several chunks (its copies share the
    prefix), and a stream whose client hangs up after its first token: each copy answers the greedy
    tokens, and the dropped stream leaves no KV behind and the server serving."""
    if server.config.pp_mode not in ("vpp", "vpp-stream"):
        pytest.skip("client request shapes take the same path through the event loop in every mode; "
                    "checked with blocking hand-offs (vpp) and with requests streaming through the V (vpp-stream)")
    prompts = make_prompts((1, CHUNK, CHUNK + 1, 3 * CHUNK + 5), seed=17)
    batch = prompts[:3]
    answers = post_json(server.url + "/generate", {
        "input_ids": batch, "return_logprob": True, "logprob_start_len": 0,
        "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW_TOKENS, "ignore_eos": True},
    }, timeout=600)  # fmt: skip
    assert isinstance(answers, list) and len(answers) == len(batch), answers
    for ids, answer in zip(batch, answers):
        check_answer(answer, ids, reference(QWEN2_8L, ids), server)
    copies = post_json(server.url + "/generate", {
        "input_ids": prompts[3],
        "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW_TOKENS, "ignore_eos": True, "n": 2},
    }, timeout=600)  # fmt: skip
    assert [c["output_ids"] for c in copies] == [reference(QWEN2_8L, prompts[3])["tokens"]] * 2
    body = json.dumps({"input_ids": prompts[3], "stream": True,
                       "sampling_params": {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as conn:
        conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        received = b""
        while b"data: {" not in received:
            chunk = conn.recv(4096)
            assert chunk, f"the stream ended before its first token: {received[:500]!r}"
            received += chunk
            # An error answer would never stream a token: fail on its status instead of waiting.
            assert len(received) < 12 or received.startswith(b"HTTP/1.1 200"), received[:500]
    assert_kv_idle(server, bound_s=30, what="a stream dropped by its client: ")
    check_answer(generate(server, prompts[1]), prompts[1], reference(QWEN2_8L, prompts[1]), server)


HELD_NEW_TOKENS = 16
HELD_ROUNDS = 8


def _abort_while_held(server, reference) -> None:
    """8 prompts of 300 tokens at once, 6 of them streamed and aborted by rid on their first
    token, when they wait to decode: in a decode slot, or held (decode_slots.py). vpp's 3 slots
    decode in 0 and 1, so with 3 micro-batches in flight a prefill that ends in slot 2 is held
    until slot 0's result (vpp-pack's 6 slots hold only while packing over-admits). Whether an
    abort lands within that one micro-batch is a race, so rounds until the trace counts a
    request aborted while held (``num_aborted_while_held``; measured 0 to 2 of 6 per round, 4 of
    5 rounds had one; up to HELD_ROUNDS rounds). The aborted end with an abort finish, the others' greedy ids equal
    transformers' (stock cpp's), KV returns to 0 on every rank (a follower's leak check would end
    the server) and the server still serves."""
    leader_path = server.trace_dir / "vpp_rank0.records.json"
    # The counter is the server's since it started: count only what these rounds add.
    before = wait_for_json(leader_path)["counters"].get("num_aborted_while_held", 0) if leader_path.exists() else 0
    held_aborts, per_round, started = 0, [], time.monotonic()
    for round_seed in range(HELD_ROUNDS):
        prompts = make_prompts((300,) * 8, seed=60 + round_seed)
        rids = [f"held-{round_seed}-{'abort' if i % 4 else 'keep'}-{i}" for i in range(len(prompts))]

        def run(i: int) -> dict:
            if i % 4:
                return abort_on_first_token(server, prompts[i], rids[i], 4 * HELD_NEW_TOKENS)
            return generate(server, prompts[i], HELD_NEW_TOKENS, rid=rids[i])

        with ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(run, range(len(prompts))))
        for i, (ids, answer) in enumerate(zip(prompts, answers)):
            if i % 4:
                finish = answer["meta_info"]["finish_reason"]
                assert finish["type"] == "abort", (rids[i], finish, server.log_tail(2000))
                assert len(answer["output_ids"]) < 4 * HELD_NEW_TOKENS
            else:
                check_answer(answer, ids, reference(QWEN2_8L, ids, HELD_NEW_TOKENS), server)
        # Written at the idle after the round: every request of it admitted, all left.
        records = wait_for_json(leader_path, until=lambda d: all_admitted_left(d) and set(rids) <= {
            rid for rec in d["decisions"] for rid in rec.get("requests", ())})
        held_aborts = records["counters"]["num_aborted_while_held"] - before
        per_round.append(held_aborts)
        if held_aborts:
            break
    print(f"vpp: {held_aborts} requests aborted while held, in {round_seed + 1} rounds, "
          f"{time.monotonic() - started:.1f} s")  # pytest -rP
    assert held_aborts > 0, (f"no request was aborted while held in {HELD_ROUNDS} rounds (held aborts so far, "
                             f"per round: {per_round}): a timing race, the check would pass vacuously")
    assert_kv_idle(server, bound_s=30)
    assert len(generate(server, make_prompts((100,), seed=6)[0], 2)["output_ids"]) == 2
    assert server.process is not None and server.process.poll() is None


def test_vpp_taper_serves_the_planned_chunks_through_the_openai_api(server, reference):
    """Greedy tokens through /v1/completions equal transformers' (hence stock cpp's, which
    test_vpp_models.py checks), and the server cut the prompt as the schedule core plans it."""
    if server.config.pp_mode != "vpp-taper":
        pytest.skip("the chunk plan is vpp-taper's")
    from sglang_vpp.schedule import build_layout, default_chunker, get_policy, split_request

    length = 600  # no other prompt of the module has this length
    ids = make_prompts((length,), seed=23)[0]
    body = {"model": "default", "prompt": ids, "max_tokens": NUM_NEW_TOKENS, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    choice = post_json(server.url + "/v1/completions", body, timeout=600)["choices"][0]
    assert choice["token_ids"] == reference(QWEN2_8L, ids)["tokens"], server.log_tail(3000)
    policy = get_policy("vpp-taper")
    chunker = default_chunker(policy, TAPER_CHUNK, build_layout(2, 8, policy.layout_kind), None, TAPER_CHUNK)
    planned = [size for _, size in split_request(chunker, length)]
    assert planned[0] < TAPER_CHUNK == max(planned)  # the ramps are exercised

    def cut(records: dict) -> dict[str, list[int]]:
        chunks: dict[str, list[int]] = {}
        for rec in records["decisions"]:
            if rec["kind"] == "admit" and rec["prefill"] and len(rec["requests"]) == 1:
                chunks.setdefault(rec["requests"][0], []).append(rec["tokens"])
        return chunks

    records = wait_for_json(server.trace_dir / "vpp_rank0.records.json",
                            until=lambda d: any(sum(c) == length for c in cut(d).values()))
    assert planned in cut(records).values(), (planned, cut(records))


def test_a_decoding_burst_uses_stock_pps_count_of_decode_micro_batches(server, reference, tmp_path):
    """8 prompts of 300 tokens at once, 8 new tokens each: greedy tokens equal transformers'
    (hence stock cpp's, test_vpp_models.py), and by the trace the running requests decode in
    the controller's P decode slots only: no cycle of the slots runs more than P decode
    micro-batches, requests that could not join a decode slot were held (not decoded where
    their prefill ran), and ``check --trace`` replays every hold and join."""
    if server.config.pp_mode not in ("vpp", "vpp-pack"):
        pytest.skip("decode grouping is exercised on the 2P-1 (vpp) and 2(2P-1) (vpp-pack) slot cycles")
    from sglang_vpp.schedule.decode_groups import decode_groups

    prompts = make_prompts((300,) * 8, seed=31)
    rids = [f"burst-{i}" for i in range(len(prompts))]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda pair: generate(server, pair[0], rid=pair[1]), zip(prompts, rids)))
    for ids, answer in zip(prompts, answers):
        check_answer(answer, ids, reference(QWEN2_8L, ids), server)
    records = wait_for_json(server.trace_dir / "vpp_rank0.records.json", until=lambda d: all_admitted_left(d)
                            and any(set(rec.get("requests", ())) & set(rids) for rec in d["decisions"]))
    groups = decode_groups({"vpp": 3, "vpp-pack": 6}[server.config.pp_mode], 2)  # 2P-1, 2(2P-1) slots
    slot_of = {build["seq"]: build["slot"] for build in records["builds"]}
    decode_seqs = sorted(rec["seq"] for rec in records["decisions"] if rec["kind"] == "admit" and not rec["prefill"])
    burst = [seq for seq in decode_seqs if set(next(rec["requests"] for rec in records["decisions"]
                                                    if rec["kind"] == "admit" and rec["seq"] == seq)) & set(rids)]
    assert burst, "the burst decoded nothing"
    assert {slot_of[seq] for seq in decode_seqs} <= set(groups.decode_slots), (
        {seq: slot_of[seq] for seq in decode_seqs}, groups.decode_slots)
    # A cycle of the slots: builds in order, a new cycle when the slot number wraps.
    per_cycle, previous = [0], -1
    for seq in sorted(slot_of):
        if slot_of[seq] <= previous:
            per_cycle.append(0)
        previous = slot_of[seq]
        per_cycle[-1] += seq in decode_seqs
    assert max(per_cycle) <= 2, per_cycle
    holds = [r for r in records["decisions"] if r["kind"] == "decode" and r["chosen"] is None]
    print(f"{server.config.pp_mode}: {len(burst)} decode micro-batches for the burst's "
          f"{NUM_NEW_TOKENS - 1} decode steps; {len(holds)} holds in the trace")  # pytest -rP
    replay = CliRunner().invoke(app, ["check", "--trace", str(server.trace_dir)])
    assert replay.exit_code == 0 and "the server followed the controller" in replay.output, replay.output


def test_stopped_rank1_in_decode_ends_the_server_and_is_named(server):
    """Each server's last test; on vpp-pack, whose server starts with the SIGSTOP cases' comm
    timeout, it ends the server."""
    if server.config.pp_mode != "vpp-pack":
        pytest.skip("the vpp-pack server starts with the SIGSTOP cases' comm timeout")
    assert_fault_ends_the_server(server, "vpp-pack-sigstop-rank1-decode", signal.SIGSTOP, 1, "decode", STOP_BOUND_S)
