"""The simulator's clock is the dry run's: one engine, the controller deciding at its event times.

The simulation (``run_mode``: the schedule core's engine with the simulator's accounting
executes what the planner emits and reports every completion to it; the controller is asked
after every instant) and the dry run (``plan_workload``: the same engine without the
accounting, on the same durations) must take the same decisions at the same times: the same
streams, every compute starting and ending where the dry run put it. The accounting decides
nothing. With jitter the controller reacts: it orders work differently from the unjittered
plan. (That the planner decides alike whoever reports the times: ``tests/schedule/
test_planner_external.py``.)"""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import POLICIES, Fold, LinearAttentionCost
from sglang_vpp.sim.runner import RunConfig, plan_workload, run_mode
from sglang_vpp.sim.workloads import long_workload, mixed_workload

COST = LinearAttentionCost(fixed_per_chunk=1e-4, transfer_per_token=1e-9)
SLOW_LINKS = LinearAttentionCost(fixed_per_chunk=1e-4, transfer_per_token=1e-5)
"""A hand-off as long as a compute: transfers queue on their communicator."""
WORKLOADS = {"three queued": long_workload([16384], num_requests=3), "mixed": mixed_workload(num_requests=24)}


def _run_both(mode: str, workload, cost, config: RunConfig):
    """(dry run's computes, simulation's computes, simulation) of one run; the streams equal."""
    result = run_mode(mode, workload, cost, config, 16, keep_schedule=True)
    dry_run = plan_workload(mode, workload, cost, config, 16).schedule
    assert dry_run.rank_actions == result.schedule.rank_actions, mode
    planned = {(e.rank, e.stage_index, e.request_index, e.chunk_index): (e.start, e.end)
               for e in dry_run.timeline}
    simulated = {(s.rank, s.stage_index, s.request_index, s.chunk_index): (s.start, s.end)
                 for s in result.sim.timeline if s.kind == "compute"}
    return planned, simulated, result


@pytest.mark.parametrize("cost", [COST, SLOW_LINKS], ids=["fast links", "slow links"])
@pytest.mark.parametrize("jitter", [0.0, 0.2])
@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("pp", [2, 4])
def test_every_compute_runs_when_the_dry_run_decided_it(pp: int, workload: str, jitter: float, cost) -> None:
    for mode in POLICIES:
        planned, simulated, result = _run_both(str(mode), WORKLOADS[workload], cost,
                                               RunConfig(pp, 2048, jitter=jitter, jitter_seed=1))
        assert planned.keys() == simulated.keys(), mode
        worst = max(abs(a - b) for key in planned for a, b in zip(planned[key], simulated[key]))
        assert worst <= 1e-9 * result.sim.makespan_s, (mode, worst)


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_the_fused_fold_runs_when_the_dry_run_decided_it_on_slow_links(pp: int) -> None:
    for mode in ("vpp", "vpp-async", "vpp-pack", "vpp-stream", "vpp-taper"):
        planned, simulated, result = _run_both(mode, WORKLOADS["mixed"], SLOW_LINKS, RunConfig(pp, 2048, fold=Fold.FUSED))
        assert planned.keys() == simulated.keys(), mode
        worst = max(abs(a - b) for key in planned for a, b in zip(planned[key], simulated[key]))
        assert worst <= 1e-9 * result.sim.makespan_s, (mode, worst)


@pytest.mark.parametrize("mode", ["vpp", "vpp-pack", "vpp-taper"])
def test_the_controller_reacts_to_stage_times_that_depart_from_its_estimate(mode: str) -> None:
    work = long_workload([16384], num_requests=3)
    exact = run_mode(mode, work, COST, RunConfig(4, 2048), 16, keep_schedule=True)
    jittered = run_mode(mode, work, COST, RunConfig(4, 2048, jitter=0.2, jitter_seed=1), 16, keep_schedule=True)
    assert [c.key for c in jittered.schedule.chunks] == [c.key for c in exact.schedule.chunks]
    assert jittered.schedule.rank_actions != exact.schedule.rank_actions


@pytest.mark.parametrize("mode", ["cpp", "vpp", "vpp-pack"])
def test_recorded_durations_reproduce_a_run(mode: str) -> None:
    """``run_engine`` on a table of a run's measured stage times (what a server records) takes the
    same decisions at the same times: the entry point a reproduction feeds."""
    from sglang_vpp.sim.cost.table import TableCostModel
    from sglang_vpp.sim.runner import run_engine

    work = WORKLOADS["mixed"]
    measured = run_mode(mode, work, COST, RunConfig(4, 2048, jitter=0.2, jitter_seed=3), 16, keep_schedule=True)
    table = TableCostModel(compute={(s.stage_index, s.request_index, s.chunk_index): s.end - s.start
                                    for s in measured.sim.timeline if s.kind == "compute"}, fallback=COST)
    again = run_engine(mode, work, RunConfig(4, 2048), 16, estimate=COST, durations=table, keep_schedule=True)
    assert again.schedule.rank_actions == measured.schedule.rank_actions
    assert again.sim.makespan_s == pytest.approx(measured.sim.makespan_s, rel=1e-12)
    assert again.sim.request_finish_s == pytest.approx(measured.sim.request_finish_s, rel=1e-12)


@pytest.mark.parametrize(("mode", "pp", "seed"), [("vpp-stream", 2, 4), ("vpp-pack", 4, 1), ("vpp-stream", 4, 7)])
def test_auto_sizes_each_closed_loop_request_alike_in_the_dry_run_and_the_simulation(mode: str, pp: int, seed: int) -> None:
    """A closed loop sends its next request when a completion is reported (the simulation) or
    when the dry run's clock reaches it, and ``auto`` sizes it from the state at that moment,
    scoring what-ifs in which the work in flight ends at its estimated ends: the same sizes,
    streams and times on both. (Sizing a request when the completing stage was decided, or
    scoring from a fork whose clock had jumped to the last in-flight end, chose other sizes
    in these cases.)"""
    config = RunConfig(pp, 16384, auto_chunk=True)
    work = mixed_workload(num_requests=12, concurrency=2, seed=seed)
    cost = LinearAttentionCost(fixed_per_chunk=1e-2)
    planned, simulated, result = _run_both(mode, work, cost, config)
    assert len(set(result.auto_sizes)) > 2, result.auto_sizes
    assert plan_workload(mode, work, cost, config, 16).auto_sizes == result.auto_sizes
    assert planned.keys() == simulated.keys()
    worst = max(abs(a - b) for key in planned for a, b in zip(planned[key], simulated[key]))
    assert worst <= 1e-9 * result.sim.makespan_s, worst
