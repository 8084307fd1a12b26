"""The control plane without processes: replicated online planners agree with each other and with
the offline ``build_schedule``; late arrivals are appended without disturbing what is planned."""

from __future__ import annotations

import queue

import pytest
from sglang_vpp.runtime.control import (
    Advance,
    CoordinatorFeed,
    FollowerFeed,
    StaticFeed,
    Submit,
    make_planner,
)
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.schedule import (
    RequestSpec,
    build_layout,
    build_schedule,
    get_policy,
    validate_schedule,
)

MODES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drain(feed, clock: FakeClock | None = None, step: float = 0.0) -> list[str]:
    out = []
    while True:
        action = feed.next_action(lambda: None)
        if action is None:
            return out
        out.append(str(action))
        if clock is not None:
            clock.now += step


def _spec(mode: str, ranks: int, lengths: list[int], chunk: int, arrivals: list[float] | None = None) -> RunSpec:
    arrivals = arrivals or [0.0] * len(lengths)
    return RunSpec("tiny-qwen3", mode, ranks, tuple(RequestArrival(n, a) for n, a in zip(lengths, arrivals)), chunk)


def _feeds(spec: RunSpec, clock: FakeClock):
    layout = build_layout(spec.num_ranks, 8, get_policy(spec.mode).layout_kind)
    queues = [queue.Queue() for _ in range(spec.num_ranks)]
    coordinator = CoordinatorFeed(make_planner(spec, layout), [(r.length, r.arrival_s) for r in spec.requests],
                                  queues[1:], epoch=0.0, lookahead=spec.lookahead, clock=clock)
    followers = [FollowerFeed(r, make_planner(spec, layout), queues[r], timeout_s=1.0) for r in range(1, spec.num_ranks)]
    return layout, coordinator, followers


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ranks", [2, 4])
def test_online_replicas_equal_offline_plan(mode, ranks):
    spec = _spec(mode, ranks, [300, 130, 64], 48)
    clock = FakeClock()
    layout, coordinator, followers = _feeds(spec, clock)
    streams = [_drain(coordinator)] + [_drain(f) for f in followers]
    offline = build_schedule(mode, ranks, 8, [RequestSpec(n) for n in (300, 130, 64)], 48,
                             chunker=make_planner(spec, layout).config.chunker)
    assert streams == [[str(a) for a in actions] for actions in offline.rank_actions]
    assert [c.key for c in coordinator.planner.sequence] == [c.key for c in offline.chunks]


@pytest.mark.parametrize("mode", MODES)
def test_late_arrival_is_planned_consistently(mode):
    """Request 1 arrives while rank 0 is mid-way through request 0: every replica sees the same ops,
    the streams validate, and request 1 enters the pipeline while request 0 is still in it (cpp,
    dcpp; vpp-pack by packing the drain window) or right after it (vpp, vpp-async: one V per
    request, the planner's request barrier)."""
    spec = _spec(mode, 2, [400, 100], 50, arrivals=[0.0, 5.0])
    clock = FakeClock()
    layout, coordinator, (follower,) = _feeds(spec, clock)
    rank0 = _drain(coordinator, clock, step=1.0)  # one second per action: request 1 lands at action 5
    rank1 = _drain(follower)
    assert coordinator.arrivals_s == follower.arrivals_s == [0.0, 5.0]
    assert rank1 == [str(a) for a in follower.planner.rank_actions(1)]
    assert rank0 == [str(a) for a in coordinator.planner.rank_actions(0)]
    from sglang_vpp.runtime.records import RankReport
    from sglang_vpp.runtime.replay import executed_schedule

    reports = [RankReport(0, 0, executed=rank0, lengths=[400, 100], arrivals_s=[0.0, 5.0],
                          chunks=[(c.request_index, c.chunk_index, c.start, c.num_tokens, c.is_last)
                                  for c in coordinator.planner.sequence]),
               RankReport(1, 0, executed=rank1)]
    validate_schedule(executed_schedule(spec, layout, reports))
    timeline = coordinator.planner.timeline
    start_1 = min(e.start for e in timeline if e.request_index == 1 and e.stage_index == 0)
    end_0 = max(e.end for e in timeline if e.request_index == 0 and e.stage_index == layout.last_stage)
    if mode in ("vpp", "vpp-async"):
        assert start_1 >= end_0, "the fold-back request barrier was not respected"
    else:
        assert start_1 < end_0, "request 1 waited for request 0 to leave the pipeline"


def test_follower_times_out_without_ops():
    spec = _spec("cpp", 2, [100], 50)
    layout = build_layout(2, 8, "contiguous")
    follower = FollowerFeed(1, make_planner(spec, layout), queue.Queue(), timeout_s=0.3)
    with pytest.raises(TimeoutError, match="no planning op from rank 0"):
        follower.next_action(lambda: None)


def test_ops_are_plain_data():
    assert Submit(10, 0.0, 1.5) == Submit(10, 0.0, 1.5)
    assert Advance(2.0).until == 2.0


def test_static_feed_replays_a_schedule():
    plan = build_schedule("vpp", 2, 8, [RequestSpec(100)], 40)
    feed = StaticFeed(1, plan)
    assert _drain(feed) == [str(a) for a in plan.rank_actions[1]]


def test_profiled_planner_cost_drives_dcpp():
    """The start-up profile sees attention grow with the prefix, so dcpp shrinks later chunks
    (with the generic estimate it would not know the model)."""
    from sglang_vpp.runtime.models import resolve_model
    from sglang_vpp.runtime.profile import profiled_cost_model

    cost = profiled_cost_model(resolve_model("tiny-qwen3"), 512, 8192)
    assert cost.per_layer is not None and cost.per_layer.a > 0
    plan = build_schedule("dcpp", 2, 8, [RequestSpec(8192)], 512, cost=cost)
    sizes = [c.num_tokens for c in plan.chunks]
    assert sizes[0] == 512 and sizes[-2] < 512 and len(sizes) > 8192 // 512
