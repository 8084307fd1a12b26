"""The fused fold (layout.py, [Note: fused fold]): the fold rank's two stages run as one."""

import pytest

from sglang_vpp.schedule import (
    FOLDBACK_MODES,
    ActionKind,
    Fold,
    Layout,
    LayoutError,
    LinearAttentionCost,
    RequestSpec,
    balance_split,
    build_controller,
    build_layout,
    build_schedule,
    check_deadlock,
    controller_config,
    default_in_flight_limit,
    find_issues,
    get_policy,
    policy_layout,
    schedule_from_json,
    schedule_to_json,
    schedule_to_text,
)
from sglang_vpp.schedule.controller import MicroBatch
from sglang_vpp.schedule.factory import tapered_chunker


@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_fused_layout_stages_ranks_layers(num_ranks):
    p = num_ranks
    split = build_layout(p, 4 * p + 3, "vpp")
    fused = build_layout(p, 4 * p + 3, "vpp", fold="fused")
    assert fused.fold is Fold.FUSED and split.fold is Fold.SPLIT
    assert fused.num_stages == 2 * p - 1
    assert [s.rank for s in fused.stages] == list(range(p)) + list(reversed(range(p - 1)))
    # Every rank but the fold rank holds two stages; the fold rank one.
    for rank in range(p - 1):
        assert fused.stages_of(rank) == (rank, 2 * p - 2 - rank)
    assert fused.stages_of(p - 1) == (p - 1,)
    # The default is the method's even split with the fold's two stages merged: every rank
    # holds the same layers as with the split fold.
    fold_stage = fused.stages[p - 1]
    assert (fold_stage.layer_start, fold_stage.layer_end) == (split.stages[p - 1].layer_start,
                                                              split.stages[p].layer_end)
    for rank in range(p):
        held = sorted(layer for s in fused.stages_of(rank)
                      for layer in range(fused.stages[s].layer_start, fused.stages[s].layer_end))
        held_split = sorted(layer for s in split.stages_of(rank)
                            for layer in range(split.stages[s].layer_start, split.stages[s].layer_end))
        assert held == held_split
    assert fused.stages[-1].layer_end == fused.num_layers


@pytest.mark.parametrize("num_ranks", [2, 3, 4, 5])
@pytest.mark.parametrize("fold", [Fold.SPLIT, Fold.FUSED])
def test_a_ranks_stages_and_the_fold_rank_for_both_folds(num_ranks, fold):
    """What a server's follower loop reads off the layout: rank r's first stage is r on the way
    down and its last is ``last_stage - r`` on the way up (the same one on a fused fold rank),
    and the fold rank, the last, hands its way-down output to itself or back up."""
    layout = build_layout(num_ranks, 4 * num_ranks, "foldback", fold=fold)
    assert layout.fold_rank == num_ranks - 1
    for rank in range(num_ranks):
        stages = layout.stages_of(rank)
        assert (stages[0], stages[-1]) == (rank, layout.last_stage - rank)
        assert (layout.rank_of(stages[0] + 1) <= rank) == (rank == layout.fold_rank)
    assert len(layout.stages_of(layout.fold_rank)) == (1 if fold is Fold.FUSED else 2)


def test_fused_layout_with_an_explicit_split():
    layout = build_layout(3, 12, "vpp", [3, 2, 4, 2, 1], fold="fused")
    assert [(s.rank, s.layer_start, s.layer_end) for s in layout.stages] == [
        (0, 0, 3), (1, 3, 5), (2, 5, 9), (1, 9, 11), (0, 11, 12)]
    with pytest.raises(LayoutError, match=r"5 entries.*fused fold.*pp=2 has 3 stages"):
        build_layout(2, 12, "vpp", [3, 2, 4, 2, 1], fold="fused")
    with pytest.raises(LayoutError, match="6 entries.*5 stages"):
        build_layout(3, 12, "vpp", [2] * 6, fold="fused")


def test_fused_fold_bad_values():
    with pytest.raises(LayoutError, match="unknown fold 'merged'"):
        build_layout(2, 8, "vpp", fold="merged")
    with pytest.raises(LayoutError, match="contiguous layout .* has no fold"):
        build_layout(2, 8, "cpp", fold="fused")
    with pytest.raises(LayoutError, match="cannot fill 4 stages") as refused:
        build_layout(2, 3, "vpp", fold="fused")  # the default split is the method's 2P stages
    # A fused layout has 3 stages: the error says why 4, and that a split of 3 counts fits.
    assert "fused fold" in str(refused.value) and "a split of 3 counts needs only 3 layers" in str(refused.value)
    assert build_layout(2, 3, "vpp", [1, 1, 1], fold="fused").num_stages == 3


def test_policy_layout_applies_the_fold_to_foldback_modes_only():
    assert policy_layout("cpp", 4, 16, fold="fused").fold is Fold.SPLIT
    assert policy_layout("vpp-pack", 4, 16, fold="fused").num_stages == 7
    assert policy_layout("vpp-pack", 4, 16).num_stages == 8


@pytest.mark.parametrize("fold", list(Fold))
def test_layout_dict_round_trip(fold):
    layout = build_layout(3, 13, "vpp", fold=fold)
    data = layout.to_dict()
    assert ("fold" in data) == (fold is Fold.FUSED)  # split layouts keep their JSON form
    assert Layout.from_dict(data) == layout


def test_schedule_json_round_trip_keeps_the_fold():
    plan = build_schedule("vpp-pack", 3, 12, [3000, 1000], 512, fold="fused")
    again = schedule_from_json(schedule_to_json(plan))
    assert again.layout.fold is Fold.FUSED
    assert again == plan


def test_hand_checked_p2_schedule():
    # One request in two chunks: rank 0 runs stage 0 of both chunks, then the last stage (2) of
    # each as rank 1's single fused forward (stage 1) returns it; rank 1 never hands a chunk to
    # itself, and runs one compute per chunk where the split fold runs two (1F, 2F).
    plan = build_schedule("vpp", 2, 4, [2048], 1024, fold="fused")
    assert schedule_to_text(plan).splitlines() == [
        "rank 0: 0F0.0 0SEND_F0.0>1@pp 0F0.1 1RECV_F0.0<1@pp 0SEND_F0.1>1@pp 2F0.0 1RECV_F0.1<1@pp 2F0.1",
        "rank 1: 0RECV_F0.0<0@pp 1F0.0 1SEND_F0.0>0@pp 0RECV_F0.1<0@pp 1F0.1 1SEND_F0.1>0@pp",
    ]
    split = build_schedule("vpp", 2, 4, [2048], 1024)
    assert schedule_to_text(split).splitlines()[1] == (
        "rank 1: 0RECV_F0.0<0@pp 1F0.0 2F0.0 2SEND_F0.0>0@pp 0RECV_F0.1<0@pp 1F0.1 2F0.1 2SEND_F0.1>0@pp")


@pytest.mark.parametrize("mode", [str(m) for m in FOLDBACK_MODES])
@pytest.mark.parametrize("num_ranks", [2, 3, 4])
def test_fused_schedules_are_valid_and_deadlock_free(mode, num_ranks):
    requests = [RequestSpec(6000), RequestSpec(700), RequestSpec(3000, 0.0)]
    plan = build_schedule(mode, num_ranks, 4 * num_ranks, requests, 1024, fold="fused", batching=True)
    assert plan.layout.fold is Fold.FUSED
    assert find_issues(plan) == []
    assert not check_deadlock(plan).deadlock
    fold_rank = plan.rank_actions[num_ranks - 1]
    computes = [a for a in fold_rank if a.kind is ActionKind.COMPUTE]
    assert len(computes) == len(plan.chunks)  # one forward per micro-batch on the fold rank


@pytest.mark.parametrize("mode", ["vpp", "vpp-pack", "vpp-stream"])
def test_windows_keep_the_method_counts(mode):
    policy = get_policy(mode)
    for num_ranks in (2, 3, 4):
        split = policy_layout(policy, num_ranks, 16)
        fused = policy_layout(policy, num_ranks, 16, fold="fused")
        assert default_in_flight_limit(fused, policy) == default_in_flight_limit(split, policy)
        assert default_in_flight_limit(fused) == 2 * num_ranks - 1
        a = build_controller(controller_config(policy, split, 1024, None, 4096))
        b = build_controller(controller_config(policy, fused, 1024, None, 4096))
        assert a.limits == b.limits
        assert len(a.decode.decode_slots) == len(b.decode.decode_slots)
        # vpp-taper's cut is planned for the method's depth, whatever the fold.
        assert tapered_chunker(1024, fused).min_chunks == tapered_chunker(1024, split).min_chunks


def test_pack_window_budget_is_the_same_work_on_a_fused_fold():
    # The drain window's budget sums stages 1 .. last-1 of the draining micro-batch and the last
    # stage of the 2P-3 in flight before it: the same layers with either fold, so with a cost
    # linear in layers the same budget.
    policy = get_policy("vpp-pack")
    budgets = {}
    for fold in Fold:
        layout = policy_layout(policy, 3, 12, fold=fold)
        controller = build_controller(controller_config(policy, layout, 1024, LinearAttentionCost(), 8192))
        for seq in range(5):
            mb = MicroBatch(seq, frozenset({0}), 1024 * seq, 1024, seq == 4, chunk_index=seq)
            controller.on_admitted(mb, controller.admission(mb))
        window = controller._current_window(0)
        assert window is not None
        budgets[fold] = window.budget
    assert budgets[Fold.FUSED] == pytest.approx(budgets[Fold.SPLIT])


def test_balance_split_on_a_fused_fold_gives_2p_minus_1_counts():
    split = balance_split(get_policy("vpp"), 3, 12, [RequestSpec(8192)], 1024, LinearAttentionCost(), max_moves=4,
                          fold="fused")
    assert len(split) == 5 and sum(split) == 12


def test_mode_stages_counts_each_modes_layout_as_policy_layout_lays_it_out():
    from sglang_vpp.schedule import mode_stages, plan_stages, policy_layout

    for fold in ("split", "fused"):
        counts = mode_stages("cpp,dcpp,vpp,vpp-pack", 3, fold)
        assert counts == {mode: len(policy_layout(mode, 3, 12, fold=fold).stages) for mode in counts}
        assert plan_stages("cpp,vpp", 3, fold) == max(counts.values())
    assert mode_stages(["cpp", "vpp"], 3, "fused") == {"cpp": 3, "vpp": 5}
