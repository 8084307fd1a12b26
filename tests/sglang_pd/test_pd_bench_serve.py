"""``bench-serve --launch MODES --pd`` with a VPP mode: the mode's prefill server behind SGLang's
router, bench_serving through the router, the per-rank idle from the prefill server's trace.

The launch machinery (``bench_serve_launch.run_launched``) runs on the session's decode server
(conftest ``deployment``), so this costs one prefill server start instead of a decode server, a
stock prefill server and a VPP prefill server of the command line; the command line's own
refusals and report are tests/sglang/test_bench_serve.py's.
"""

from __future__ import annotations

import importlib.util

import pytest
from conftest import CHUNK
from sglang_harness import SKIP_NO_SGLANG

from sglang_vpp.cli.bench_serve_launch import LaunchSpec, run_launched
from sglang_vpp.serving.bench_serving import LoadPlan, Workload, run_pass

SKIP_NO_PD = pytest.mark.skipif(
    importlib.util.find_spec("mooncake") is None or importlib.util.find_spec("sglang_router") is None,
    reason="Mooncake or sglang-router is not installed: run scripts/install_sglang_cpu.sh",
)
pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG, SKIP_NO_PD, pytest.mark.timeout(900)]

INPUT_LEN = 300
"""Five chunks of 64."""


def test_pd_launch_measures_a_vpp_prefill_through_the_router(deployment, pd_model_dir, tmp_path):
    spec = LaunchSpec(model_dir=str(pd_model_dir), pp_size=2, chunked_prefill_size=CHUNK, work_dir=tmp_path, pd=True)
    plan = LoadPlan(workload=Workload.LONG, num_requests=1, input_len=INPUT_LEN, output_len=2, concurrency=1,
                    warmup=0, tokenizer=str(pd_model_dir), progress=False)
    urls, events = [], []

    def one_pass(url: str, seed: int):
        urls.append(url)
        return run_pass(plan, url, tmp_path / "bench.jsonl", tmp_path / "bench.log", seed_offset=seed, warmup=0)

    runs = run_launched(spec, ["vpp-pack"], repeats=1, warm_up=lambda url: one_pass(url, 100) and 1,
                        run_once=one_pass, on_event=events.append, deployment=deployment)
    (run,) = runs
    assert set(urls) == {run.url} and run.url != deployment.decode.url, (urls, run.url)
    assert "starting --pp-mode vpp-pack as the prefill server, and the router" in events, events
    (serving_pass,) = run.passes
    assert serving_pass.num_requests == 1 and not serving_pass.num_failed, serving_pass.errors
    assert serving_pass.ttfts[0] > 0 and serving_pass.input_lens == [INPUT_LEN]
    (idle,) = run.idle
    # The measured request only: 5 chunks, each one compute per virtual stage (2 per rank).
    assert idle.num_ranks == 2 and idle.num_micro_batches == 5, idle.to_json()
    assert idle.num_prefill_computes == 5 * 4, idle.to_json()
    assert all(rank.busy_s > 0 for rank in idle.ranks)
    assert deployment.prefill is None and deployment.decode is not None  # the decode server stays
