"""vpp-stream's three rules on small hand-checked cases: no request barrier, the deep window (open
only while the micro-batches in flight differ in cost) and the finish-first-once-full order
(``policies/vpp_stream.py``)."""

import pytest

from sglang_vpp.schedule import (
    Admission,
    Controller,
    FixedChunker,
    MicroBatch,
    Planner,
    dry_run,
    ControllerConfig,
    RequestSpec,
    StageCostModel,
    build_layout,
    check_deadlock,
    get_policy,
    schedule_from_planner,
    validate_schedule,
)
from sglang_vpp.schedule.controller import DEEP_WINDOW_SPREAD, default_in_flight_limit


class UnitStage(StageCostModel):
    """Every stage of every micro-batch takes 1."""

    def stage_cost(self, stage, chunk):
        return 1.0


def _controller(mode: str, pp: int = 2) -> Controller:
    spec = get_policy(mode)
    return Controller(spec, build_layout(pp, 4 * pp, spec.layout_kind), UnitStage())


def _prompt(seq: int, request: str) -> MicroBatch:
    """A whole one-chunk prompt."""
    return MicroBatch(seq, frozenset((request,)), start=0, num_tokens=64, ends_request=True)


def _admit(controller: Controller, mb: MicroBatch) -> Admission:
    decision = controller.admission(mb)
    if decision is not Admission.NO:
        controller.on_admitted(mb, decision)
    return decision


def test_the_next_request_enters_while_the_previous_one_is_in_flight():
    stream, paper = _controller("vpp-stream"), _controller("vpp-async")
    for controller in (stream, paper):
        assert _admit(controller, _prompt(0, "a")) is Admission.YES
    assert _admit(stream, _prompt(1, "b")) is Admission.YES
    assert paper.admission(_prompt(1, "b")) is Admission.NO  # the barrier: a has not left


class TokenStage(StageCostModel):
    """Every stage of a micro-batch takes its token count."""

    def stage_cost(self, stage, chunk):
        return float(chunk.total_tokens)


def _sized(seq: int, request: str, tokens: int) -> MicroBatch:
    return MicroBatch(seq, frozenset((request,)), start=0, num_tokens=tokens, ends_request=True)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_window_is_twice_2p_minus_1_and_counts_decode(pp):
    spec = get_policy("vpp-stream")
    controller = Controller(spec, build_layout(pp, 4 * pp, spec.layout_kind), TokenStage())
    window = 2 * (2 * pp - 1)
    assert controller.limits.in_flight == window == default_in_flight_limit(controller.layout, controller.policy)
    assert controller.limits.slots == _controller("vpp-pack", pp).limits.slots  # SGLang's slot count unchanged
    # Costs 64 and 128 in flight: they differ by more than DEEP_WINDOW_SPREAD, so the window is deep.
    micro_batches = [_sized(i, f"r{i}", 64 if i % 2 else 128) for i in range(window - 1)]
    micro_batches.append(MicroBatch(window - 1, frozenset(("d",)), 100, 1, True, is_prefill=False))
    assert [_admit(controller, mb) for mb in micro_batches] == [Admission.YES] * window
    assert controller.deep_window_open
    assert controller.admission(_sized(window, "late", 64)) is Admission.NO
    controller.on_left(0)
    assert _admit(controller, _sized(window, "late", 64)) is Admission.YES
    assert controller.num_packed == 0


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_equal_micro_batches_keep_the_window_at_2p_minus_1(pp):
    """Equal costs: 2P-1 keep every rank busy, so the deep window stays closed; one micro-batch
    that costs more than 1 + DEEP_WINDOW_SPREAD times the others opens it."""
    spec = get_policy("vpp-stream")
    controller = Controller(spec, build_layout(pp, 4 * pp, spec.layout_kind), TokenStage())
    full = 2 * pp - 1
    assert [_admit(controller, _sized(i, f"r{i}", 100)) for i in range(full)] == [Admission.YES] * full
    assert not controller.deep_window_open
    assert controller.admission(_sized(full, "next", 100)) is Admission.NO
    assert controller.admission(_sized(full, "next", 500)) is Admission.NO  # the window reads what is in flight
    controller.on_left(0)
    assert _admit(controller, _sized(full, "r-big", 100 * (1 + DEEP_WINDOW_SPREAD) + 1)) is Admission.YES
    assert controller.deep_window_open
    assert _admit(controller, _sized(full + 1, "next", 100)) is Admission.YES  # 2P-1 + 1
    key_open = controller.state_key()
    controller.on_left(full)  # the costly one leaves: equal again, closed
    assert not controller.deep_window_open and controller.state_key()[-1] != key_open[-1]
    assert controller.admission(_sized(full + 2, "next", 100)) is Admission.NO
    # vpp-pack keeps its 2P-1 whatever the costs (it has no deep window).
    assert Controller(get_policy("vpp-pack"), controller.layout, TokenStage()).limits.in_flight == full


def test_rank_0_feeds_the_pipeline_until_it_is_full_then_finishes_the_oldest():
    controller = _controller("vpp-stream", pp=2)  # 2P-1 = 3 keep every rank busy
    ready = [(0, 2), (3, 0)]  # stage 0 of micro-batch 2, the last stage of micro-batch 0
    _admit(controller, _prompt(0, "a"))
    _admit(controller, _prompt(1, "b"))
    assert not controller.full_pipeline and controller.pick(0, ready) == (0, 2)  # 2 in flight: feed
    assert controller.pick_key(0) == (False,)
    _admit(controller, _prompt(2, "c"))
    ready = [(0, 3), (3, 0)]
    assert controller.full_pipeline and controller.pick(0, ready) == (3, 0)  # 3 in flight: finish
    assert controller.pick_key(0) == (True,)
    controller.on_left(0)
    assert controller.pick(0, [(0, 3), (3, 1)]) == (0, 3)  # 2 again: feed
    # vpp-async feeds first whatever is in flight.
    paper = _controller("vpp-async", pp=2)
    assert paper.pick(0, [(0, 3), (3, 0)]) == (0, 3) and paper.pick_key(0) == (False,)


def test_other_ranks_order_as_vpp_async_whatever_is_in_flight():
    stream, paper = _controller("vpp-stream", pp=4), _controller("vpp-async", pp=4)
    for seq in range(7):
        _admit(stream, _prompt(seq, f"r{seq}"))
    assert stream.full_pipeline
    for rank, ready in ((1, [(1, 6), (6, 2)]), (2, [(2, 5), (5, 3)]), (3, [(3, 4), (4, 3)])):
        assert stream.pick(rank, ready) == paper.pick(rank, ready)
        assert stream.pick_key(rank) == (False,)


def _plan(mode: str, lengths: list[int]) -> Planner:
    spec = get_policy(mode)
    planner = Planner(ControllerConfig(spec, build_layout(2, 8, spec.layout_kind), FixedChunker(64), UnitStage()),
                      sees_transfers=True)
    for length in lengths:
        planner.submit(RequestSpec(length))
    dry_run(planner)
    return planner


def test_two_one_chunk_prompts_share_the_v():
    """P = 2, every stage 1. vpp-async: b starts when a has left (t = 4) and ends at 8. vpp-stream:
    b's stage 0 runs at t = 1 beside a's stage 1; rank 1 runs a's fold (stage 2, which feeds rank
    0) before b's stage 1, so a ends at 4 as before and b at 6."""
    paper, stream = _plan("vpp-async", [64, 64]), _plan("vpp-stream", [64, 64])
    assert paper.request_finish == {0: 4.0, 1: 8.0}
    assert stream.request_finish == {0: 4.0, 1: 6.0}
    starts = {(e.request_index, e.stage_index): e.start for e in stream.timeline}
    assert starts[(1, 0)] == 1.0 and starts[(0, 2)] == 2.0 and starts[(1, 1)] == 3.0
    plan = schedule_from_planner(stream)
    validate_schedule(plan)
    assert not check_deadlock(plan).deadlock
