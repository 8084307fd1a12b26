"""``auto`` sized from the planner's live state (``AutoSizer.choose_live``, ``Planner.fork``)."""

from __future__ import annotations

from collections import deque

import pytest

from sglang_vpp.schedule import (DryRun, FixedChunker, LinearAttentionCost, Planner, RequestSpec, build_layout,
                                 controller_config, dry_run, get_policy)
from sglang_vpp.schedule.auto_size import TIE_TOLERANCE, AutoSizer, LiveSituation, _Replacements

# One rank, one layer: a chunk of c tokens costs 1 s + c ms, so every plan below is a sum.
COST = LinearAttentionCost(linear_per_token=1e-3, attention_per_pair=0.0, fixed_per_chunk=1.0)


def _planner(chunk_size: int = 1000, *, auto: bool = True, mode: str = "cpp", ranks: int = 1,
             batching: bool = False, on_complete=None) -> Planner:
    spec = get_policy(mode)
    layout = build_layout(ranks, ranks * 2 if spec.layout_kind.value != "contiguous" else ranks, spec.layout_kind)
    config = controller_config(spec, layout, chunk_size, COST, 1 << 20, batching=batching, auto_chunk=auto)
    return Planner(config, on_complete=on_complete, sees_transfers=True)


def _state(planner: Planner) -> tuple:
    return (list(planner.sequence), dict(planner.request_finish), [list(a) for a in planner._actions],
            planner.now, list(planner._rank_free))


def test_a_fork_plans_on_without_touching_the_live_planner():
    live = _planner(auto=False)
    live.submit(RequestSpec(4000))
    run = DryRun(live)
    run.run(until=3.0)
    before = _state(live)
    twin = live.fork(FixedChunker(1000), None)
    twin.submit(RequestSpec(2000, live.now))
    dry_run(twin)
    assert _state(live) == before
    # 4 chunks of 2 s, then 2 of 2 s: hand-checked sums on the one rank.
    assert twin.request_finish == {0: 8.0, 1: 12.0}
    live.submit(RequestSpec(2000, live.now))
    run.run()
    assert live.request_finish == twin.request_finish


@pytest.mark.parametrize("stops", [True, False])
def test_choose_live_keeps_in_flight_chunks_and_sizes_only_the_arriving_request(monkeypatch, stops):
    """A 4000-token request in flight was cut at 1000 (4 x 2 s); a 2000-token one arrives at 0.
    Cut at 1024 it costs (1 + 1.024) + (1 + 0.976) = 4 s and ends at 12; whole (2048 and up)
    it costs 3 s and ends at 11. Planning both from scratch at 2048 would cut the first request
    too; the live plan must not. 2048 is planned first; 1024's plan stops just past 11 s, where
    its bounds (makespan 11.02, mean (8 + 11.02) / 2) show it loses: without the stop it runs on."""
    if not stops:
        monkeypatch.setattr(AutoSizer, "_stop", staticmethod(lambda results: None))
    live = _planner(chunk_size=8192)
    live.controller.chunker.resize([1000])  # the in-flight request was cut for itself alone
    live.submit(RequestSpec(4000))
    chunks_before = [c.num_tokens for c in live.sequence]
    choice = live.controller.chunker.resize_live(live, [(2000, 0.0)])
    assert [c.num_tokens for c in live.sequence] == chunks_before
    scores = {size: (makespan, mean) for size, makespan, mean in choice.scores}
    if stops:
        assert (1024, False) in choice.stopped
        assert scores[1024] == pytest.approx((11.0 * (1 + TIE_TOLERANCE), (8.0 + 11.0 * (1 + TIE_TOLERANCE)) / 2))
    else:
        assert choice.stopped == ()
        assert scores[1024] == pytest.approx((12.0, 10.0))
    assert scores[2048] == pytest.approx((11.0, 9.5))
    assert choice.chunk_size == 2048  # ties past it go to the smaller size
    assert choice.situation == (4000, 2000)


def test_the_first_send_is_the_situation_sent_together():
    empty = _planner(chunk_size=65536, mode="vpp-pack", ranks=2)
    live = empty.controller.chunker.resize_live(empty, [(30_000, 0.0), (5_000, 0.0), (5_000, 0.0)])
    alone = _planner(chunk_size=65536, mode="vpp-pack", ranks=2).controller.chunker.resize([30_000, 5_000, 5_000])
    assert live.chunk_size == alone.chunk_size
    assert [s[0] for s in live.scores] == [s[0] for s in alone.scores]
    assert [x for s in live.scores for x in s[1:]] == pytest.approx([x for s in alone.scores for x in s[1:]])


def test_live_choice_is_deterministic_and_sets_the_batch_budget():
    sizes = []
    for _ in range(2):
        live = _planner(chunk_size=65536, mode="vpp-stream", ranks=2, batching=True)
        situation = LiveSituation(live)
        situation.sent([RequestSpec(20_000), RequestSpec(3_000)])
        live.submit(RequestSpec(20_000))
        live.submit(RequestSpec(3_000))
        DryRun(live).run(until=0.5)
        size = situation.sent([RequestSpec(7_000, 0.6)], to_come=3)
        assert size == live.controller.token_budget
        sizes.append((size, live.controller.chunker.history[-1].scores))
    assert sizes[0] == sizes[1]


def test_a_controller_without_auto_ignores_the_situation():
    live = _planner(auto=False)
    assert LiveSituation(live).sent([RequestSpec(5000)]) is None


def test_replacements_send_the_completed_length_as_often_as_told():
    twin = _planner(auto=False)
    follow = _Replacements(2)
    follow.twin = twin
    twin.submit(RequestSpec(1500))
    twin.submit(RequestSpec(700))
    assert follow(1, 4.0) == [RequestSpec(700, 4.0)]
    assert follow(0, 5.0) == [RequestSpec(1500, 5.0)]
    assert follow(0, 6.0) == []


def test_a_batched_micro_batch_is_finished_for_every_part_before_any_callback():
    seen = []

    def on_complete(index: int, end: float) -> list[RequestSpec]:
        seen.append(dict(planner.request_finish))
        return []

    planner = _planner(chunk_size=4096, auto=False, batching=True, on_complete=on_complete)
    planner.submit(RequestSpec(1000))
    planner.submit(RequestSpec(1000))
    dry_run(planner)
    assert len(planner.sequence) == 1  # one forward carried both
    assert seen == [{0: 3.0, 1: 3.0}, {0: 3.0, 1: 3.0}]


def _mutable(value) -> bool:
    containers = (list, dict, set, bytearray, deque)
    return isinstance(value, containers) or hasattr(value, "__dict__") or hasattr(value, "__slots__")


def test_a_fork_has_every_field_of_the_planner_and_shares_no_mutable_state():
    """A field added to ``Planner`` is in the fork, and whatever of it can change is the fork's
    own: the read-only parts (config, estimate, callbacks) are the only objects both hold."""
    live = _planner(mode="vpp-stream", ranks=2, batching=True)
    live.submit(RequestSpec(6000))
    live.submit(RequestSpec(900))
    DryRun(live).run(until=2.5)
    twin = live.fork(FixedChunker(1000), 1000)
    assert vars(twin).keys() == vars(live).keys()
    read_only = {"config", "_on_complete"}
    for name, value in vars(live).items():
        mine = getattr(twin, name)
        if name in read_only or not _mutable(value) or isinstance(value, tuple):
            continue
        assert mine is not value, name
        if isinstance(value, list):
            assert not any(a is b for a, b in zip(mine, value) if isinstance(a, list)), name
    # The controller's state moves on alone; its estimate, layout and policy are shared.
    assert twin.controller._in_flight is not live.controller._in_flight
    assert twin.controller.cost is live.controller.cost


def test_a_fork_continued_like_the_live_planner_plans_the_same():
    live = _planner(mode="vpp-stream", ranks=2, batching=True, auto=False, chunk_size=1000)
    for length in (6000, 900, 2500):
        live.submit(RequestSpec(length))
    run = DryRun(live)
    run.run(until=4.0)
    actions = [len(live.rank_actions(rank)) for rank in range(2)]
    twin = live.fork(live.controller.chunker, live.controller.token_budget)
    for planner in (live, twin):
        planner.submit(RequestSpec(3000, 4.0))
    run.run()
    dry_run(twin)
    assert twin.request_finish == live.request_finish
    # The fork's streams are what it ran after the fork, as the live planner's tail is.
    assert [list(map(str, twin.rank_actions(rank))) for rank in range(2)] == [
        list(map(str, live.rank_actions(rank)[actions[rank]:])) for rank in range(2)]
    assert twin.timeline == []
