"""Every command builds its controller in ``schedule/factory.py``: given one cost model,
``schedule``, ``check``, ``simulate`` and ``bench`` cut every prompt into the same chunks, and
the SGLang plugin's controller (fold-back modes; its dcpp is SGLang's own) cuts them too."""

from __future__ import annotations

import pytest

from sglang_vpp.cli.schedule_cmd import plan_from_options
from sglang_vpp.runtime.control import make_planner
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.schedule import (FOLDBACK_MODES, POLICIES, LinearAttentionCost, RequestSpec, build_layout, get_policy,
                                 split_request)
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState
from sglang_vpp.sim.runner import RunConfig, plan_workload
from sglang_vpp.sim.workloads import Workload

LAYERS = 16
CHUNK = 2048
# Not exactly quadratic in the prompt length (a fixed cost and a transfer), so the DCPP fit is
# a real least-squares fit.
COST = LinearAttentionCost(linear_per_token=2e-6, attention_per_pair=3e-9, fixed_per_chunk=1e-3,
                           transfer_per_token=1e-8)


def _cuts(chunks) -> list[tuple[int, int]]:
    return sorted((part.start, part.num_tokens) for chunk in chunks for part in chunk.parts)


@pytest.mark.parametrize("mode", [str(p) for p in POLICIES])
@pytest.mark.parametrize("length", [3000, 16384, 65536])
def test_commands_cut_identical_chunks(mode: str, length: int) -> None:
    pp = 2
    schedule = plan_from_options(mode, pp, str(length), str(CHUNK), 1, LAYERS, None, cost=COST)
    check = plan_from_options(mode, pp, str(length), str(CHUNK), 1, LAYERS, None, groups=None, cost=COST)
    workload = Workload("test", (RequestSpec(length),), None)
    simulate = plan_workload(mode, workload, COST, RunConfig(pp, CHUNK), LAYERS).schedule
    layout = build_layout(pp, LAYERS, get_policy(mode).layout_kind)
    spec = RunSpec("tiny-qwen3", mode, pp, (RequestArrival(length, 0.0),), CHUNK, planner_cost=COST)
    planner = make_planner(spec, layout)
    planner.submit(RequestSpec(length))
    bench = planner.sequence
    expected = _cuts(schedule.chunks)
    assert expected[-1][0] + expected[-1][1] == length
    assert _cuts(check.chunks) == expected
    assert _cuts(simulate.chunks) == expected
    assert _cuts(bench) == expected
    if mode in FOLDBACK_MODES:
        state = VppState(config=VppConfig(mode=mode, pp_size=pp), rank=0)
        state.ensure_layout(LAYERS)
        plugin = state.build_controller(CHUNK)
        assert sorted(split_request(plugin.chunker, length)) == expected
    if mode == "dcpp" and length == 65536:
        assert len(expected) > length // CHUNK  # the curve shrinks later chunks
