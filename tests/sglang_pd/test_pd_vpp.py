"""A VPP prefill server behind SGLang's router, with a stock pp-1 decode server, over Mooncake TCP.

The session's decode server (conftest ``deployment``, with the plugin: it publishes global KV
layer ids) serves every prefill server in turn. Through the router, four prompts of different
lengths (3 to 5 chunks of 64; the last sent while the others are in prefill) must decode to
transformers' greedy continuation, and to what the stock PP (``cpp``) prefill gave
(test_pd_router.py records that; served here only when that module did not run). On the
8-layer tiny Qwen2 at --pp-size 2, rank 0 owns layers 0-1 and 6-7 and rank 1 layers 2-5, so
positional pairing would put KV into the wrong layers; only pairing by id gives these tokens.
The vpp-pack server is started and measured by ``bench-serve --launch ... --pd``'s launch code
(the four prompts are its warm-up); its trace replays through the controller (``sglang-vpp check
--trace``). The same vpp-pack prefill also runs over two nodes (two launches, one rank each),
whose last use is kill -9 of node 1's rank.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, NodeLaunch, ServerConfig, assert_kv_idle, free_port, wait_for_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "sglang_vpp"))
from vpp_checks import (  # noqa: E402
    GRAMMAR_POLL_ENV, QWEN2_8L, Reference, all_admitted_left, constrained_tokens_checked, make_prompts,
)
from conftest import CHUNK, PROMPT_LENGTHS, PROMPT_SEED, SERVED  # noqa: E402
from pd_checks import NUM_NEW, check, check_mixed, four_prompts, prefill_of, serve  # noqa: E402

from sglang_vpp.serving.pd_launcher import prefill_config  # noqa: E402

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
# The first test may start the decode, cpp and vpp-pack servers (when test_pd_router.py did not
# run first): up to ~8 min on a loaded 2-core host, past the suite default of 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def model_dir(pd_model_dir) -> Path:
    return pd_model_dir


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return make_prompts(PROMPT_LENGTHS, seed=PROMPT_SEED)


@pytest.fixture(scope="module")
def greedy(tiny_model):
    """transformers' greedy continuation of a prompt."""
    reference = Reference(tiny_model)
    return lambda ids: reference(QWEN2_8L, ids, NUM_NEW)["tokens"]


@pytest.fixture(scope="module")
def expected(greedy, prompts) -> list[list[int]]:
    return [greedy(ids) for ids in prompts]


@pytest.fixture(scope="module")
def cpp_answers(deployment, model_dir, prompts, expected) -> list[list[int]]:
    if "cpp" not in SERVED:
        answers = four_prompts(serve(deployment, model_dir, "cpp").url, prompts, deployment)
        check(deployment, "cpp prefill", answers, expected)
        SERVED["cpp"] = answers
    return SERVED["cpp"]


BENCH_INPUT_LEN = 300
"""The bench_serving pass's one prompt: five chunks of 64."""


def test_vpp_pack_prefill_equals_cpp_and_transformers_and_its_trace_replays(
        deployment, model_dir, prompts, expected, cpp_answers, tmp_path):
    """vpp-pack's prefill server as ``bench-serve --launch vpp-pack --pd`` starts and measures it
    (``bench_serve_launch.run_launched``, on the session's decode server: one prefill server start
    instead of the command line's decode, stock prefill and VPP prefill servers; the command
    line's own refusals and report are tests/sglang/test_bench_serve.py's). Its warm-up is the
    four prompts: equal to the cpp prefill's and transformers' answers, KV back to 0. Then a
    bench_serving pass through the router, whose per-rank idle comes from the prefill server's
    trace (the warm-up excluded); the whole trace replays through the controller."""
    from typer.testing import CliRunner

    from sglang_vpp.cli.app import app
    from sglang_vpp.cli.bench_serve_launch import LaunchSpec, run_launched
    from sglang_vpp.serving.bench_serving import LoadPlan, Workload, run_pass

    spec = LaunchSpec(model_dir=str(model_dir), pp_size=2, chunked_prefill_size=CHUNK, work_dir=tmp_path, pd=True)
    plan = LoadPlan(workload=Workload.LONG, num_requests=1, input_len=BENCH_INPUT_LEN, output_len=2, concurrency=1,
                    warmup=0, tokenizer=str(model_dir), progress=False)
    urls, events = [], []

    def warm_up(url: str) -> int:
        urls.append(url)
        answers = four_prompts(url, prompts, deployment)
        check(deployment, "vpp-pack prefill", answers, cpp_answers)
        check(deployment, "vpp-pack prefill", answers, expected)
        return len(prompts)

    def one_pass(url: str, seed: int):
        urls.append(url)
        return run_pass(plan, url, tmp_path / "bench.jsonl", tmp_path / "bench.log", seed_offset=seed, warmup=0)

    runs = run_launched(spec, ["vpp-pack"], repeats=1, warm_up=warm_up, run_once=one_pass, on_event=events.append,
                        deployment=deployment)
    (run,) = runs
    assert set(urls) == {run.url} and run.url != deployment.decode.url, (urls, run.url)
    assert "starting --pp-mode vpp-pack as the prefill server, and the router" in events, events
    (serving_pass,) = run.passes
    assert serving_pass.num_requests == 1 and not serving_pass.num_failed, serving_pass.errors
    assert serving_pass.ttfts[0] > 0 and serving_pass.input_lens == [BENCH_INPUT_LEN]
    (idle,) = run.idle
    # The measured request only: 5 chunks, each one compute per virtual stage (2 per rank).
    assert idle.num_ranks == 2 and idle.num_micro_batches == 5, idle.to_json()
    assert idle.num_prefill_computes == 5 * 4, idle.to_json()
    assert all(rank.busy_s > 0 for rank in idle.ranks)
    assert deployment.prefill is None and deployment.decode is not None  # the decode server stays
    trace_dir = tmp_path / "trace-vpp-pack"
    wait_for_json(trace_dir / "vpp_rank0.records.json", until=all_admitted_left)
    wait_for_json(trace_dir / "vpp_rank1.records.json")
    replay = CliRunner().invoke(app, ["check", "--trace", str(trace_dir)])
    assert replay.exit_code == 0, replay.output
    assert "the server followed the controller" in replay.output


@pytest.mark.parametrize("mode", ["vpp", "vpp-taper"])  # vpp-async: vpp-pack without packing; vpp-stream below
def test_every_vpp_mode_prefill_equals_cpp(deployment, model_dir, prompts, cpp_answers, mode):
    router = serve(deployment, model_dir, mode, extra_env=GRAMMAR_POLL_ENV)
    check(deployment, f"{mode} prefill", four_prompts(router.url, prompts, deployment), cpp_answers)
    # Constrained decoding through the split: the prefill's first token under the grammar (rank 0's
    # readiness decision on its event log, vpp/grammar_sync.py), the decode server's the rest.
    constrained_tokens_checked(router, seed=53, logs=deployment.prefill)
    assert_kv_idle(deployment.prefill, deployment.decode, what="after constrained requests: ")


def test_auto_sizes_the_prefill_batches_on_every_rank_and_its_trace_replays(
        deployment, model_dir, prompts, expected, tmp_path):
    """vpp-stream with --chunked-prefill-size auto on the prefill server: rank 0 tells the
    controller the prompts waiting before each batch, every rank applies the size it chose
    (equal ``resize`` records), no prefill forward is larger than the size in force (a server
    that only prefills takes it as the budget of new batches: ``check --trace`` checks each),
    and the answers equal transformers'."""
    from dataclasses import replace

    from typer.testing import CliRunner

    from sglang_vpp.cli.app import app
    from sglang_vpp.trace_records import RESIZE

    trace_dir = tmp_path / "trace"
    config = replace(prefill_of(model_dir, "vpp-stream", ("--vpp-trace", str(trace_dir))), chunked_prefill_size="auto")
    router = deployment.serve_prefill(config)
    check(deployment, "vpp-stream auto prefill", four_prompts(router.url, prompts, deployment), expected)
    leader = wait_for_json(trace_dir / "vpp_rank0.records.json", until=all_admitted_left)
    follower = wait_for_json(trace_dir / "vpp_rank1.records.json")
    resizes = [(d["lengths"], d["size"], d["tapered"]) for d in leader["decisions"] if d["kind"] == RESIZE]
    assert resizes and resizes == [(d["lengths"], d["size"], d["tapered"])
                                   for d in follower["decisions"] if d["kind"] == RESIZE]
    assert leader["controller"]["decodes"] is False
    replay = CliRunner().invoke(app, ["check", "--trace", str(trace_dir)])
    assert replay.exit_code == 0, replay.output
    assert "the server followed the controller" in replay.output


def test_32_concurrent_mixed_through_a_vpp_prefill_equal_transformers(deployment, model_dir, greedy):
    """32 requests of 1 to 4 chunks at once through the router, on a vpp-stream prefill that
    sizes its own chunks (``--chunked-prefill-size auto``; the one the test above left running,
    else a fresh one): every answer equals transformers', KV back to 0 on both sides."""
    from dataclasses import replace

    prefill = deployment.prefill
    running = prefill is not None and deployment.router is not None and prefill.process.poll() is None
    if running and prefill.config.pp_mode == "vpp-stream" and prefill.config.chunked_prefill_size == "auto":
        url = deployment.router.url
    else:
        url = deployment.serve_prefill(replace(prefill_of(model_dir, "vpp-stream"), chunked_prefill_size="auto")).url
    check_mixed(deployment, url, greedy)


def test_vpp_pack_prefill_over_two_nodes_equals_cpp_and_a_dead_node_ends_it(
        deployment, model_dir, prompts, cpp_answers, tmp_path):
    """The prefill server of a PD split over two nodes (``--nnodes 2``, one pipeline rank per
    node, joined only through ``--dist-init-addr``; both nodes' KV senders register with node
    0's bootstrap server): the router's answers equal the one-node cpp prefill's, and each node
    holds its own virtual stages. Its last use: kill -9 of node 1's rank while a long prompt is
    in prefill ends both launches within the kill bound and leaves no process; node 0's log
    says that none of its own ranks failed and where to look; the router's client gets an
    error, not a hang; the decode server holds no KV."""
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor
    from dataclasses import replace

    from fault_driver import KILL_BOUND_S, FaultRun
    from pd_checks import ERROR_BOUND_S, LONG_PROMPT, post_status, prefill_batches_logged, wait_in_prefill

    bootstrap_port, init_addr = free_port(), f"127.0.0.1:{free_port()}"
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, pp_size=2, pp_mode="vpp-pack")

    def node(rank: int) -> ServerConfig:
        # Each launch its own --nccl-port (prefill_config draws one): both run on this host.
        launch = replace(base, extra_args=("--nnodes", "2", "--dist-init-addr", init_addr, "--node-rank", str(rank)),
                         extra_env=(("SGLANG_CPU_OMP_THREADS_BIND", str(rank)),))
        return prefill_config(launch, bootstrap_port)

    deployment.stop_prefill()
    follower = NodeLaunch(node(1), tmp_path / "node1.log")
    try:
        follower.start(timeout=600)
        router = deployment.serve_prefill(node(0), timeout=600)
        leader = deployment.prefill
        node1 = (("prefill node 1", follower),)
        check(deployment, "vpp-pack prefill over two nodes", four_prompts(router.url, prompts, deployment, extra=node1),
              cpp_answers, extra=node1)
        assert "VPP node 0 holds virtual stages (0, 3)" in leader.log_tail(10**7)
        assert "VPP node 1 holds virtual stages (1, 2)" in follower.log_tail(10**7)

        runs = [FaultRun(leader), FaultRun(follower)]
        before = prefill_batches_logged(leader.log_path, ranks=1)  # one pipeline rank per node
        long_prompt = make_prompts([LONG_PROMPT], 45)[0]
        payload = {"input_ids": long_prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
        with ThreadPoolExecutor(1) as pool:
            client = pool.submit(lambda: (*post_status(router.url + "/generate", payload, 300.0), time.monotonic()))
            wait_in_prefill(leader.log_path, 1, before, client)
            runs[1].signal_rank(1, signal.SIGKILL)
            runs[0].signalled_at = runs[1].signalled_at
            gone = {}
            for run, what in zip(runs, ("node 0", "node 1")):
                gone[what] = run.wait_gone(KILL_BOUND_S)
                assert gone[what] is not None, f"{what}'s launch outlived {KILL_BOUND_S} s"
                assert run.leftovers() == [], what
            status, body, answered_at = client.result(timeout=ERROR_BOUND_S)
        answered = answered_at - runs[1].signalled_at
        print(f"kill -9 of node 1's rank: node 0 gone after {gone['node 0']:.1f} s, node 1 after "
              f"{gone['node 1']:.1f} s, the client's error after {answered:.1f} s")
        assert status >= 400 or '"abort"' in body, f"the client got {status}, not an error: {body[:300]}"
        log = leader.log_path.read_text(errors="replace")
        # node 0's rank saw its peer die and ended itself (exit code 0), not killed by its teardown
        assert "sglang-vpp: pipeline rank ended: pp_rank=0" in log, log[-4000:]
        assert "no pipeline rank of this launcher was killed" in log and "--nnodes" in log, log[-4000:]
        assert_kv_idle(deployment.decode, what="decode server after the prefill's node died: ")
    finally:
        deployment.stop_prefill()
        follower.stop()
