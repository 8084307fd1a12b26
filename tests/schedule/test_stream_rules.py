"""vpp-stream's three rules on small hand-checked cases: no request barrier, the deep window and
the finish-first-once-full order (``policies/vpp_stream.py``)."""

import pytest

from sglang_vpp.schedule import (
    Admission,
    Controller,
    FixedChunker,
    MicroBatch,
    Planner,
    ControllerConfig,
    RequestSpec,
    StageCostModel,
    build_layout,
    check_deadlock,
    get_policy,
    schedule_from_planner,
    validate_schedule,
)
from sglang_vpp.schedule.controller import default_in_flight_limit


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


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_the_window_is_twice_2p_minus_1_and_counts_decode(pp):
    controller = _controller("vpp-stream", pp)
    window = 2 * (2 * pp - 1)
    assert controller.limits.in_flight == window == default_in_flight_limit(controller.layout, controller.policy)
    assert controller.limits.slots == _controller("vpp-pack", pp).limits.slots  # SGLang's slot count unchanged
    micro_batches = [_prompt(i, f"r{i}") for i in range(window - 1)]
    micro_batches.append(MicroBatch(window - 1, frozenset(("d",)), 100, 1, True, is_prefill=False))
    assert [_admit(controller, mb) for mb in micro_batches] == [Admission.YES] * window
    assert controller.admission(_prompt(window, "late")) is Admission.NO
    controller.on_left(0)
    assert _admit(controller, _prompt(window, "late")) is Admission.YES
    assert controller.num_packed == 0


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
    planner = Planner(ControllerConfig(spec, build_layout(2, 8, spec.layout_kind), FixedChunker(64), UnitStage()))
    for length in lengths:
        planner.submit(RequestSpec(length))
    planner.advance()
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
