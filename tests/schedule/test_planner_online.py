"""The planner as an online loop: incremental submission, arrivals, closed-loop sources."""

from sglang_vpp.schedule import (
    FixedChunker,
    LinearAttentionCost,
    Planner,
    ControllerConfig,
    RequestSpec,
    build_layout,
    DryRun,
    build_schedule,
    check_deadlock,
    dry_run,
    get_policy,
    schedule_from_planner,
    validate_schedule,
)


def _config(policy="vpp-pack", num_ranks=2):
    spec = get_policy(policy)
    return ControllerConfig(spec, build_layout(num_ranks, 8, spec.layout_kind), FixedChunker(64), LinearAttentionCost())


def test_incremental_equals_offline_when_all_known_up_front():
    requests = [RequestSpec(300), RequestSpec(200), RequestSpec(500)]
    planner = Planner(_config(), sees_transfers=True)
    for r in requests:
        planner.submit(r)
    dry_run(planner)
    offline = build_schedule("vpp-pack", 2, 8, requests, 64)
    assert tuple(tuple(planner.rank_actions(r)) for r in range(2)) == offline.rank_actions


def test_requests_submitted_while_others_run():
    planner = Planner(_config(), sees_transfers=True)
    planner.submit(RequestSpec(640))
    run = DryRun(planner)
    run.run(until=planner.now)  # plan only what can start now
    first = [list(planner.rank_actions(r)) for r in range(2)]
    assert first[0] and not any(a.request_index == 1 for acts in first for a in acts)
    run.run()  # run the first request to the end
    assert planner.settled
    taken = [len(planner.rank_actions(r)) for r in range(2)]
    planner.submit(RequestSpec(320, arrival=planner.now))
    run.run()
    plan = schedule_from_planner(planner)
    validate_schedule(plan)
    assert not check_deadlock(plan).deadlock
    assert {c.request_index for c in plan.chunks} == {0, 1}
    new = [planner.rank_actions(r)[taken[r]:] for r in range(2)]
    assert any(a.request_index == 1 for acts in new for a in acts)


def test_arrival_time_delays_admission():
    planner = Planner(_config("cpp"), sees_transfers=True)
    planner.submit(RequestSpec(64))
    planner.submit(RequestSpec(64, arrival=1.0))
    dry_run(planner)
    start_r1 = min(e.start for e in planner.timeline if e.request_index == 1)
    assert start_r1 >= 1.0


def test_closed_loop_source_submits_on_completion():
    still_to_send = [3]

    def on_complete(index, finish):
        if still_to_send[0] == 0:
            return []
        still_to_send[0] -= 1
        return [RequestSpec(128, arrival=finish)]

    planner = Planner(_config(), on_complete=on_complete, sees_transfers=True)
    planner.submit(RequestSpec(128))
    dry_run(planner)
    assert len(planner.requests) == 4
    assert sorted(planner.request_finish) == [0, 1, 2, 3]
    for i in range(1, 4):
        assert planner.requests[i].arrival == planner.request_finish[i - 1]
