"""The method doc's analytic check, executed: tau_k = (k + 1) t with free communication.

- ``vpp`` on P = 2: no rank idles while the pipeline is full (the growth is absorbed:
  tau_{k-1} + tau_{k+1} = 2 tau_k), whereas ``cpp``'s second rank idles t every step;
- uniform tau: neither idles in steady state and both finish together.
"""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import build_schedule
from sglang_vpp.sim import simulate_schedule
from sglang_vpp.sim.metrics import steady_state_idle, steady_state_window

from simtools import LinearTau

NUM_CHUNKS = 10
LAYERS = 8  # 4 per contiguous stage, 2 per fold-back stage


def _run(mode: str, cost, num_ranks: int = 2):
    schedule = build_schedule(mode, num_ranks, LAYERS, [NUM_CHUNKS * 64], 64, cost=cost)
    return simulate_schedule(schedule, cost)


@pytest.mark.parametrize("mode", ["vpp", "vpp-async", "vpp-pack"])
def test_vpp_has_no_imbalance_bubble_under_linear_tau(mode):
    result = _run(mode, LinearTau())
    start, end = steady_state_window(result)
    assert end - start > 0.5 * result.makespan_s  # a real steady state, not an empty window
    assert steady_state_idle(result) == pytest.approx([0.0, 0.0], abs=1e-9)


def test_cpp_idles_every_step_under_linear_tau():
    result = _run("cpp", LinearTau())
    idle = steady_state_idle(result)
    # Rank 1 runs C_k (4 (k+1)) while rank 0 runs C_{k+1} (4 (k+2)): it waits 4 t per step.
    assert idle[0] == pytest.approx(0.0, abs=1e-9)
    assert idle[1] >= 4.0 * (NUM_CHUNKS - 3)


@pytest.mark.parametrize("mode", ["cpp", "vpp", "vpp-async"])
def test_uniform_tau_no_steady_state_idle(mode):
    assert steady_state_idle(_run(mode, LinearTau(uniform=True))) == pytest.approx([0.0, 0.0], abs=1e-9)


def test_uniform_tau_cpp_and_vpp_tie():
    cpp = _run("cpp", LinearTau(uniform=True))
    vpp = _run("vpp-async", LinearTau(uniform=True))
    assert vpp.makespan_s == pytest.approx(cpp.makespan_s)
    linear_cpp, linear_vpp = _run("cpp", LinearTau()), _run("vpp-async", LinearTau())
    assert linear_vpp.makespan_s < linear_cpp.makespan_s  # and VPP wins when tau grows


def test_worked_example_t1_k3():
    """Method doc s3.2: t = 1, k = 3: while pp1 runs s1, s2 of C3 (busy 8 in per-layer units of
    its 2 stages), pp0 runs s3/C2 (3) + s0/C4 (5) = 8."""
    result = _run("vpp", LinearTau(t=0.5))  # fold-back stages hold 2 layers: tau_k = (k + 1)
    spans = {s.action: s.end - s.start for s in result.timeline if s.kind == "compute"}
    assert spans["1F0.3"] + spans["2F0.3"] == pytest.approx(8.0)
    assert spans["3F0.2"] + spans["0F0.4"] == pytest.approx(8.0)


@pytest.mark.parametrize("num_ranks", [4, 8])
def test_deeper_pipelines_absorb_growth_with_async_vpp(num_ranks):
    """s3.2 for P > 2: rank r pairs C_{k+d} with C_{k-d}; with two groups and async sends no rank
    idles in steady state, while cpp's later ranks idle more and more."""
    cost = LinearTau()
    schedule = build_schedule("vpp-async", num_ranks, 4 * num_ranks, [24 * 64], 64, cost=cost)
    result = simulate_schedule(schedule, cost)
    start, end = steady_state_window(result)
    assert end > start
    assert steady_state_idle(result) == pytest.approx([0.0] * num_ranks, abs=1e-9)
    cpp = build_schedule("cpp", num_ranks, 4 * num_ranks, [24 * 64], 64, cost=cost)
    cpp_idle = steady_state_idle(simulate_schedule(cpp, cost))
    assert cpp_idle[-1] > cpp_idle[1] > 0
