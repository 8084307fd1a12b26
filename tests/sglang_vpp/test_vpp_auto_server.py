"""``--chunked-prefill-size auto`` on a real server: a burst of short prompts is batched at the
size the controller chose for the situation (not SGLang's cap), every rank applies that size,
the tokens equal transformers', and ``check --trace`` replays every size.

One server (vpp-pack, --pp-size 2, the 8-layer tiny Qwen2, the CPU estimate); the no-server
checks of the same path are in test_vpp_auto_chunk.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig
from typer.testing import CliRunner
from vpp_checks import QWEN2_8L, Reference, all_admitted_left, generate_concurrently, make_prompts, wait_for_json

from sglang_vpp.cli.app import app
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.trace_records import ADMIT, RESIZE

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

BURST = (300,) * 8


def test_a_burst_is_batched_at_the_auto_size_on_every_rank(server_pool, tiny_model, tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    config = ServerConfig(model_dir=str(tiny_model(QWEN2_8L)), pp_size=2, pp_mode="vpp-pack",
                          chunked_prefill_size="auto", extra_args=("--vpp-trace", str(trace)))
    server = server_pool.get(config, timeout=300)
    prompts = make_prompts(BURST, seed=7)
    answers = generate_concurrently(server, prompts)
    reference = Reference(tiny_model)
    assert [a["output_ids"] for a in answers] == [reference(QWEN2_8L, p)["tokens"] for p in prompts]
    leader = wait_for_json(Path(trace) / "vpp_rank0.records.json", timeout=60, until=all_admitted_left)
    follower = wait_for_json(Path(trace) / "vpp_rank1.records.json", timeout=60)
    resizes = [(d["lengths"], d["size"]) for d in leader["decisions"] if d["kind"] == RESIZE]
    assert resizes == [(d["lengths"], d["size"]) for d in follower["decisions"] if d["kind"] == RESIZE]
    burst_sizes = {size for lengths, size in resizes if set(lengths) == {300}}
    assert burst_sizes and max(burst_sizes) < sum(BURST) < SERVER_CAP, resizes  # the cap would batch all 8
    burst_batches = [d["tokens"] for d in leader["decisions"]
                     if d["kind"] == ADMIT and d["prefill"] and d["tokens"] > 1 and len(d["requests"]) > 1]
    assert burst_batches and max(burst_batches) <= max(burst_sizes), (burst_batches, resizes)
    result = CliRunner().invoke(app, ["check", "--trace", str(trace)])
    assert result.exit_code == 0 and "the server followed the controller" in result.output, result.output
