"""Short prompts on deep pipelines (docs/auto-chunk.md, "The short cells, from idle by cause"):
DeepSeek-V3.1 on Ascend 910C, 100 concurrent prompts batched up to the chunk size.

- with whole requests (the runs that section reads) the request barrier is what loses at
  P >= 4: vpp-pack with auto is far behind cpp, vpp-stream with auto (no barrier) close to it;
  with partial fill a forward holds one batch's end and the next one's head, the two stay in one
  group, and vpp-pack draws level;
- what vpp-stream still pays: a rank runs two forwards per micro-batch, so at one micro-batch
  size its scheduling gap is cpp's plus the host time of the second forward (the revisit);
- vpp-stream's plans of batched short loads (and auto's) are valid and deadlock-free.
"""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import check_deadlock, find_issues
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, plan_workload
from sglang_vpp.sim.sweep import simulate_matrix
from sglang_vpp.schedule import RequestSpec
from sglang_vpp.sim.workloads import Workload, build_workload

QUIET = SimConfig(record_timeline=False)


@pytest.fixture(scope="module")
def deepseek():
    model = load_model("deepseek-v3.1")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


def _short(length: int, count: int = 100):
    return build_workload("short", lengths=[length], num_requests=count)


def _short_cell_at_p4(deepseek, partial_fill: bool):
    """cpp's and dcpp's best throughput over their swept sizes, and vpp-stream's and vpp-pack's runs
    with auto: 100 concurrent 16K prompts at P = 4."""
    model, cost = deepseek
    work = _short(16 << 10)
    base = simulate_matrix(work, cost, model.num_layers, "cpp,dcpp", [8192, 16384, 32768], 4, sim=QUIET,
                           partial_fill=partial_fill)
    best = max(row.result.sim.throughput_tok_s for row in base)
    stream, pack = (simulate_matrix(work, cost, model.num_layers, mode, ["auto"], 4, sim=QUIET,
                                    partial_fill=partial_fill)[0].result.sim
                    for mode in ("vpp-stream", "vpp-pack"))
    assert stream.ok and pack.ok
    return best, stream, pack


def test_the_barrier_not_the_v_loses_the_short_cell_at_p4_with_whole_requests(deepseek):
    best, stream, pack = _short_cell_at_p4(deepseek, partial_fill=False)
    assert pack.throughput_tok_s < 0.85 * best  # one V per batch: ranks wait upstream
    assert stream.throughput_tok_s > 0.98 * best
    # auto gives vpp-pack 6K here (11.9 s of upstream_wait per rank against 4.6 s)
    assert pack.idle_by_cause["upstream_wait"] > 2 * stream.idle_by_cause["upstream_wait"]


def test_a_filled_forward_keeps_the_next_batch_in_the_group_so_the_barrier_stops_nothing(deepseek):
    best, stream, pack = _short_cell_at_p4(deepseek, partial_fill=True)
    assert pack.throughput_tok_s > 0.97 * best
    assert stream.throughput_tok_s > 0.97 * best
    # no V waits alone for its batch: vpp-pack's ranks wait upstream no longer than vpp-stream's
    assert pack.idle_by_cause["upstream_wait"] <= 1.05 * stream.idle_by_cause["upstream_wait"]


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_the_second_forward_adds_the_revisit_to_the_scheduling_gap(deepseek, num_ranks):
    model, cost = deepseek
    rows = simulate_matrix(_short(4 << 10, 40), cost, model.num_layers, "cpp,vpp-stream", [16384], num_ranks,
                           sim=QUIET)
    cpp, stream = (row.result.sim for row in rows)
    assert stream.num_chunks == cpp.num_chunks  # the same micro-batches
    hardware = cost.hardware
    share = hardware.revisit_overhead_s / hardware.chunk_overhead_s
    assert stream.idle_by_cause["scheduling_gap"] == pytest.approx((1 + share) * cpp.idle_by_cause["scheduling_gap"])


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
@pytest.mark.parametrize("chunk,auto,concurrency", [(8192, False, 30), (16384, False, 8), (65536, True, 30),
                                                    (65536, True, 8)])
def test_batched_short_plans_are_valid_and_deadlock_free(deepseek, num_ranks, chunk, auto, concurrency):
    """30 prompts of 1K, 4K and 16K, all at once or 8 clients in a closed loop."""
    model, cost = deepseek
    requests = tuple(RequestSpec((1024, 4096, 16384)[i % 3]) for i in range(30))
    work = Workload("short", requests, concurrency, "30 x 1K/4K/16K")
    config = RunConfig(num_ranks, chunk, auto_chunk=auto)
    plan = plan_workload("vpp-stream", work, cost, config, model.num_layers).schedule
    assert not find_issues(plan), (num_ranks, chunk, find_issues(plan)[:3])
    report = check_deadlock(plan)
    assert not report.deadlock, report.describe(plan.rank_actions)
