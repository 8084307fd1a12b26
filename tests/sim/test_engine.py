"""The engine on hand-written streams: exact times and the compute / exposed comm / bubble split."""

from __future__ import annotations

import json

import pytest

from sglang_vpp.schedule import (LinearAttentionCost, Planner, RequestSpec, build_schedule, controller_config, get_policy,
                                 schedule_from_json, schedule_to_json,
                                 policy_layout, schedule_from_planner)
from sglang_vpp.sim import SimConfig, SimDeadlockError, SliceKind, simulate_schedule
from sglang_vpp.sim.engine import simulate_live

from simtools import ConstCost, text_schedule

TWO_CHUNKS = [
    "0F0.0 0SEND_F0.0>1@pp 0F0.1 0SEND_F0.1>1@pp",
    "0RECV_F0.0<0@pp 1F0.0 0RECV_F0.1<0@pp 1F0.1",
]


def _split(result, rank):
    r = result.per_rank[rank]
    return round(r.compute_s, 9), round(r.exposed_comm_s, 9), round(r.bubble_s, 9)


def test_async_send_overlaps_compute():
    result = simulate_schedule(text_schedule(TWO_CHUNKS, "async"), ConstCost(1.0, 0.5))
    # chunk 0: s0 [0,1], hop [1,1.5], s1 [1.5,2.5]; chunk 1: s0 [1,2], hop [2,2.5] (overlaps s1),
    # s1 [2.5,3.5].
    assert result.makespan_s == pytest.approx(3.5)
    assert _split(result, 0) == (2.0, 0.0, 1.5)
    assert _split(result, 1) == (2.0, 0.5, 1.0)  # waits 1 for data (bubble), 0.5 for the hop
    starts = {s.action: s.start for s in result.timeline if s.kind is SliceKind.COMPUTE}
    assert starts == {"0F0.0": 0.0, "0F0.1": 1.0, "1F0.0": 1.5, "1F0.1": 2.5}


def test_blocking_send_holds_the_rank():
    result = simulate_schedule(text_schedule(TWO_CHUNKS, "blocking"), ConstCost(1.0, 0.5))
    # rank 0 is held by each send until the transfer ends; the second receive is posted only
    # when rank 1 reaches it (2.5), so the second hop runs [2.5, 3].
    assert result.makespan_s == pytest.approx(4.0)
    assert _split(result, 0) == (2.0, 1.0, 1.0)
    assert _split(result, 1) == (2.0, 1.0, 1.0)


def test_accounting_identity_every_policy():
    cost = LinearAttentionCost(transfer_per_token=2e-7)
    for mode in ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"):
        result = simulate_schedule(build_schedule(mode, 2, 8, [8192, 4096], 1024, cost=cost), cost)
        for rank in result.per_rank:
            assert rank.compute_s + rank.exposed_comm_s + rank.bubble_s == pytest.approx(result.makespan_s)
        assert 0 <= result.bubble_ratio < 1


def test_transfers_on_one_communicator_serialize():
    # Two hops of 3 s each after 1 s computes: the second cannot start before the first ends.
    result = simulate_schedule(text_schedule(TWO_CHUNKS, "async"), ConstCost(1.0, 3.0))
    sends = sorted((s.start, s.end) for s in result.timeline if s.kind is SliceKind.SEND)
    assert sends == [(1.0, 4.0), (4.0, 7.0)]
    assert result.makespan_s == pytest.approx(8.0)


def test_separate_groups_run_concurrently():
    lines = [
        "0F0.0 0SEND_F0.0>1@fwd 2RECV_F0.0<1@bwd 3F0.0",
        "0RECV_F0.0<0@fwd 1F0.0 2F0.0 2SEND_F0.0>0@bwd",
    ]
    result = simulate_schedule(text_schedule(lines, "async", "foldback", num_chunks=1, policy="vpp-async"),
                               ConstCost(1.0, 0.25))
    assert result.makespan_s == pytest.approx(4.5)
    assert result.num_transfers == 2


def test_deadlock_is_reported_not_hung():
    # Both ranks send first on one blocking group: the heads never pair.
    lines = [
        "0F0.0 0SEND_F0.0>1@pp 2RECV_F0.0<1@pp 3F0.0",
        "2SEND_F0.0>0@pp 0RECV_F0.0<0@pp 1F0.0 2F0.0",
    ]
    schedule = text_schedule(lines, "blocking", "foldback", num_chunks=1, policy="vpp")
    result = simulate_schedule(schedule, ConstCost())
    assert not result.ok and result.deadlock.deadlock
    assert {b["rank"] for b in result.deadlock.blocked} == {0, 1}
    with pytest.raises(SimDeadlockError) as info:
        simulate_schedule(schedule, ConstCost(), SimConfig(raise_on_deadlock=True))
    assert "deadlock" in str(info.value)
    # The engine's own stall detection, without the dry run first, reports it too.
    stalled = simulate_schedule(schedule, ConstCost(), SimConfig(check_deadlock=False))
    assert stalled.deadlock is not None and stalled.deadlock.deadlock


def test_one_group_async_negative_control_deadlocks():
    # vpp-async on one group: sends in both directions share one ordered communicator.
    schedule = build_schedule("vpp-async", 2, 8, [4096], 512, num_groups=1)
    result = simulate_schedule(schedule, LinearAttentionCost())
    assert result.deadlock is not None


def _live(mode, num_ranks, num_layers, lengths, chunk_size, cost):
    """``build_schedule``'s plan, decided as the simulation runs it."""
    layout = policy_layout(get_policy(mode), num_ranks, num_layers, None, "split")
    planner = Planner(controller_config(mode, layout, chunk_size, cost, max(lengths), batching=False),
                      sees_transfers=True)
    for length in lengths:
        planner.submit(RequestSpec(length))
    return simulate_live(planner, cost), schedule_from_planner(planner)


@pytest.mark.parametrize("mode", ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"])
@pytest.mark.parametrize("num_ranks", [2, 4])
def test_the_simulation_starts_every_compute_when_the_dry_run_does(mode, num_ranks):
    """The simulator's accounting changes no time: with the dry run's cost model, every compute
    starts when the dry run (the planner's timeline, from the engine's reports) says, in the
    same order. (An executor independent of the engine: ``tests/schedule/test_planner_external.py``.)"""
    cost = LinearAttentionCost()
    schedule = build_schedule(mode, num_ranks, 48, [65536, 32768, 100000], 8192, cost=cost)
    result, emitted = _live(mode, num_ranks, 48, [65536, 32768, 100000], 8192, cost)
    assert emitted.rank_actions == schedule.rank_actions
    planned = {(e.stage_index, e.request_index, e.chunk_index): e.start for e in schedule.timeline}
    executed = {(s.stage_index, s.request_index, s.chunk_index): s.start
                for s in result.timeline if s.kind is SliceKind.COMPUTE}
    assert executed.keys() == planned.keys()
    assert max(abs(executed[k] - planned[k]) for k in planned) < 1e-9


def test_arrivals_gate_stage_zero():
    cost = ConstCost(1.0)
    schedule = build_schedule("cpp", 2, 4, [200, 200], 100, cost=cost)
    late = simulate_schedule(schedule, cost, arrivals={0: 5.0, 1: 5.0})
    assert min(s.start for s in late.timeline if s.kind is SliceKind.COMPUTE) == pytest.approx(5.0)
    assert late.request_ttft_s[0] == pytest.approx(late.request_finish_s[0] - 5.0)
    # Waiting for the first arrival is no bubble: the accounting starts there.
    assert late.start_s == 5.0 and late.per_rank[0].idle_by_cause["release"] == 0.0
    # A later arrival is: rank 0 ran its two chunks on [5, 7], then waits for request 1 at 20.
    gap = simulate_schedule(schedule, cost, arrivals={0: 5.0, 1: 20.0})
    assert gap.per_rank[0].idle_by_cause["release"] == pytest.approx(13.0)


def test_stage_zero_starts_when_the_controller_admitted_it():
    # Rank 1 is 3x slower: the controller (window P = 2) admits chunk 2 when chunk 0 leaves
    # stage 1 at 4; the same streams given in advance run as given.
    class Slow1(ConstCost):
        def stage_cost(self, stage, chunk):
            return 3.0 if stage.rank == 1 else 1.0

    live, emitted = _live("cpp", 2, 4, [400], 100, Slow1())
    free = simulate_schedule(emitted, Slow1())
    start = lambda r, action: next(s.start for s in r.timeline if s.action == action)  # noqa: E731
    assert start(free, "0F0.2") == pytest.approx(2.0)
    assert start(live, "0F0.2") == pytest.approx(4.0)
    assert live.per_rank[0].idle_by_cause["admission"] > 0
    assert free.per_rank[0].idle_by_cause["admission"] == 0

def test_given_streams_that_name_no_requests_start_at_once():
    """A JSON schedule without its requests (hand-written streams) runs: every request is there
    from the start, as without arrivals."""
    schedule = build_schedule("cpp", 2, 4, [200], 100)
    data = schedule_to_json(schedule)
    data = data if isinstance(data, dict) else json.loads(data)
    data.pop("requests")
    bare = schedule_from_json(data)
    assert bare.requests == ()
    cost = ConstCost(1.0)
    assert simulate_schedule(bare, cost).makespan_s == pytest.approx(simulate_schedule(schedule, cost).makespan_s)


def test_a_planner_that_never_admits_is_named_not_reported_as_a_deadlock():
    """Work the controller never lets in leaves every rank without work and nothing blocked:
    the simulation says where the planner stopped instead of reporting a deadlock of no ranks."""
    from sglang_vpp.schedule import Admission
    from sglang_vpp.sim import SimError

    cost = LinearAttentionCost()
    layout = policy_layout(get_policy("vpp-async"), 2, 8, None, "split")
    planner = Planner(controller_config("vpp-async", layout, 1024, cost, 4096, batching=False), sees_transfers=True)
    planner.submit(RequestSpec(4096))
    planner.controller.admission = lambda micro_batch: Admission.NO
    with pytest.raises(SimError, match="stalled with no rank blocked: planner stopped with work left"):
        simulate_live(planner, cost)
