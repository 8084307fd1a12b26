"""Every policy x (P, chunks, requests): build, validate, dry-run, and an independent oracle."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_vpp.schedule import (
    ActionKind,
    CommSemantics,
    RequestSpec,
    build_schedule,
    check_deadlock,
    find_issues,
    validate_schedule,
)

POLICIES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]
CHUNK = 64
CASES = [(p, c, r) for p in (2, 3, 4) for c in (1, 2, 5, 17, 64) for r in (1, 3, 8)]


def _plan(policy, num_ranks, num_chunks, num_requests, **kw):
    # Lengths that do not divide evenly exercise the remainder chunk.
    lengths = [num_chunks * CHUNK - (i * 13) % CHUNK for i in range(num_requests)]
    return build_schedule(policy, num_ranks, 4 * num_ranks, lengths, CHUNK, **kw)


def _activation_oracle(plan):
    """Independent check: each (stage, chunk) runs once on its owner and every cross-rank
    hand-off has one send and one receive."""
    layout = plan.layout
    computes = [(a.key, r) for r, acts in enumerate(plan.rank_actions) for a in acts if a.kind is ActionKind.COMPUTE]
    expected = {(s, *c.key) for c in plan.chunks for s in range(layout.num_stages)}
    assert sorted(k for k, _ in computes) == sorted(expected)
    assert all(layout.rank_of(k[0]) == r for k, r in computes)
    hops = {(s, *c.key) for c in plan.chunks for s in range(layout.num_stages - 1)
            if layout.rank_of(s) != layout.rank_of(s + 1)}
    for kind in (ActionKind.SEND, ActionKind.RECV):
        keys = [a.key for acts in plan.rank_actions for a in acts if a.kind is kind]
        assert sorted(keys) == sorted(hops)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("num_ranks, num_chunks, num_requests", CASES)
def test_every_policy_is_valid_and_deadlock_free(policy, num_ranks, num_chunks, num_requests):
    plan = _plan(policy, num_ranks, num_chunks, num_requests)
    validate_schedule(plan)
    report = check_deadlock(plan)
    assert not report.deadlock, report.describe(plan.rank_actions)
    _activation_oracle(plan)


@pytest.mark.parametrize("policy", ["vpp-async", "vpp-pack"])
@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_single_group_bidirectional_async_deadlocks_with_cycle(policy, num_ranks):
    """Negative control: both directions' hand-offs on ONE group per pair pair up out of order.
    The dry run (the engine, pairing each link in order as NCCL/HCCL do) stops there, and the
    streams emitted up to that point deadlock in a two-rank cycle."""
    plan = _plan(policy, num_ranks, 8, 2, num_groups=1)
    assert find_issues(plan)  # cut short: some stages never run
    report = check_deadlock(plan)
    assert report.deadlock
    assert len(report.cycle) == 2
    a, b = report.cycle
    assert a["waits_for"] == b["rank"] and b["waits_for"] == a["rank"]
    assert abs(a["rank"] - b["rank"]) == 1


def test_naive_blocking_send_then_recv_deadlocks():
    """The paper's vanilla hazard: both ranks send first, blocking, on one group."""
    from sglang_vpp.schedule import compute, recv, send

    rank0 = [compute(0, 0, 1), send(0, 0, 1, 1, "pp"), recv(2, 0, 0, 1, "pp"), compute(3, 0, 0)]
    rank1 = [compute(2, 0, 0), send(2, 0, 0, 0, "pp"), recv(0, 0, 1, 0, "pp"), compute(1, 0, 1)]
    report = check_deadlock(rank_actions=[rank0, rank1], comm_semantics="blocking")
    assert report.deadlock and {w["rank"] for w in report.cycle} == {0, 1}
    # The same streams on two directional groups complete with async sends...
    two = [[a if a.kind is ActionKind.COMPUTE else type(a)(a.kind, a.stage_index, a.request_index, a.chunk_index,
            a.peer, "fwd" if a.stage_index == 0 else "bwd") for a in acts] for acts in (rank0, rank1)]
    assert not check_deadlock(rank_actions=two, comm_semantics="async").deadlock
    # ...but not with blocking sends: groups alone do not fix a blocking send-first order.
    assert check_deadlock(rank_actions=two, comm_semantics="blocking").deadlock


def test_vpp_is_blocking_on_one_group_and_async_modes_use_two():
    assert _plan("vpp", 2, 8, 1).comm_semantics is CommSemantics.BLOCKING
    assert _plan("vpp", 2, 8, 1).groups == ("pp",)
    for policy in ("vpp-async", "vpp-pack"):
        plan = _plan(policy, 2, 8, 1)
        assert plan.groups == ("fwd", "bwd")
        for rank, actions in enumerate(plan.rank_actions):
            for a in actions:
                if a.kind is ActionKind.SEND:
                    assert a.group == ("fwd" if a.peer > rank else "bwd")


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    num_ranks=st.integers(2, 4),
    lengths=st.lists(st.integers(1, 40 * CHUNK), min_size=1, max_size=8),
    arrivals=st.lists(st.floats(0, 0.01), min_size=8, max_size=8),
    chunk=st.integers(16, 200),
)
def test_property_random_requests(policy, num_ranks, lengths, arrivals, chunk):
    requests = [RequestSpec(n, a) for n, a in zip(lengths, arrivals)]
    plan = build_schedule(policy, num_ranks, 2 * num_ranks + 1, requests, chunk)
    validate_schedule(plan)
    assert not check_deadlock(plan).deadlock


def test_planner_is_deterministic():
    a = _plan("vpp-pack", 3, 17, 5)
    b = _plan("vpp-pack", 3, 17, 5)
    assert a.rank_actions == b.rank_actions


def test_same_stage_order_everywhere():
    """Every stage sees chunks in one global order: what makes per-group pairing trivial."""
    for policy in POLICIES:
        plan = _plan(policy, 3, 9, 4)
        orders = {}
        for actions in plan.rank_actions:
            for a in actions:
                if a.kind is ActionKind.COMPUTE:
                    orders.setdefault(a.stage_index, []).append(a.chunk_key)
        reference = orders[0]
        assert all(order == reference for order in orders.values())
