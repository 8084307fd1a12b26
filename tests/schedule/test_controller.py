"""The online controller alone: admission, barrier, packing window and order, without a planner."""

import pytest

from sglang_vpp.schedule import Admission, Controller, MicroBatch, StageCostModel, build_layout, get_policy


class LinearTau(StageCostModel):
    """tau_k = (k + 1) t per stage, t = 1."""

    def stage_cost(self, stage, chunk):
        return float(chunk.chunk_index + 1)


def _controller(mode: str, pp: int = 2, max_in_flight: int | None = None) -> Controller:
    layout = build_layout(pp, 4 * pp, "foldback" if mode.startswith("vpp") else "contiguous")
    return Controller(get_policy(mode), layout, LinearTau(), max_in_flight)


def _chunk(seq: int, request: str, index: int, last: bool = False) -> MicroBatch:
    return MicroBatch(seq, frozenset((request,)), start=64 * index, num_tokens=64, ends_request=last, chunk_index=index)


def _admit(controller: Controller, mb: MicroBatch) -> Admission:
    decision = controller.admission(mb)
    if decision is not Admission.NO:
        controller.on_admitted(mb, decision)
    return decision


def test_in_flight_limit_is_2p_minus_1_for_foldback_and_counts_decode():
    controller = _controller("vpp-async", pp=2)
    decode = [MicroBatch(i, frozenset((f"r{i}",)), 100, 1, True, is_prefill=False) for i in range(4)]
    assert [_admit(controller, mb) for mb in decode] == [Admission.YES] * 3 + [Admission.NO]
    controller.on_left(0)
    assert _admit(controller, decode[3]) is Admission.YES


def test_barrier_holds_the_next_request_until_the_previous_left():
    controller = _controller("vpp")
    assert _admit(controller, _chunk(0, "a", 0)) is Admission.YES
    assert _admit(controller, _chunk(1, "a", 1, last=True)) is Admission.YES
    b0 = _chunk(2, "b", 0)
    assert controller.admission(b0) is Admission.NO
    controller.on_left(0)
    assert controller.admission(b0) is Admission.NO
    controller.on_left(1)
    assert _admit(controller, b0) is Admission.YES


def test_a_micro_batch_sharing_a_request_continues_its_group():
    controller = _controller("vpp")
    assert _admit(controller, _chunk(0, "a", 0)) is Admission.YES
    shared = MicroBatch(1, frozenset(("a", "b")), 64, 64, ends_request=True)
    assert _admit(controller, shared) is Admission.YES
    assert _admit(controller, _chunk(2, "b", 1)) is Admission.YES  # b joined a's group
    assert controller.admission(_chunk(3, "c", 0)) is Admission.NO


def test_decode_is_outside_the_barrier():
    controller = _controller("vpp")
    _admit(controller, _chunk(0, "a", 0, last=True))
    assert controller.admission(MicroBatch(1, frozenset(("z",)), 50, 1, True, is_prefill=False)) is Admission.YES


def test_cpp_streams_requests_without_barrier():
    controller = _controller("cpp")
    _admit(controller, _chunk(0, "a", 0, last=True))
    assert _admit(controller, _chunk(1, "b", 0)) is Admission.YES


def _draining_request_a() -> Controller:
    """N = 8 chunks of request a, P = 2, t = 1, in the steady state: C5, C6, C7 in flight."""
    controller = _controller("vpp-pack")
    for k in range(8):
        if k >= 3:
            controller.on_left(k - 3)
        assert _admit(controller, _chunk(k, "a", k, last=k == 7)) is Admission.YES
    assert controller.in_flight == 3
    return controller


def test_packing_fills_the_method_window_earliest_chunks_first():
    """Window 9 (the method's (N + 1) t): C'0 + C'1 + C'2 = 6 fit."""
    controller = _draining_request_a()
    assert [_admit(controller, _chunk(8 + k, "b", k)) for k in range(3)] == [Admission.PACKED] * 3
    assert controller.num_packed == 3
    for seq in (5, 6, 7):
        controller.on_left(seq)
    # Once the drained request left, b's chunks continue as ordinary admissions.
    assert _admit(controller, _chunk(11, "b", 3)) is Admission.YES
    assert controller.num_packed == 3


def test_packing_stops_when_the_budget_is_spent():
    controller = _draining_request_a()
    assert _admit(controller, _chunk(8, "b", 0)) is Admission.PACKED  # 1 of 9
    assert _admit(controller, _chunk(9, "b", 1)) is Admission.PACKED  # 3 of 9
    assert controller.in_flight < controller.limits.slots
    assert controller.admission(_chunk(10, "b", 6)) is Admission.NO  # 7 > 6 left
    assert controller.admission(_chunk(10, "b", 5)) is Admission.PACKED  # 6 fits


@pytest.mark.parametrize("mode", ["vpp", "vpp-async"])
def test_no_packing_without_pack(mode):
    controller = _controller(mode)
    _admit(controller, _chunk(0, "a", 0, last=True))
    assert controller.admission(_chunk(1, "b", 0)) is Admission.NO
    assert controller.num_packed == 0


def test_window_opens_only_after_the_last_chunk_is_admitted():
    controller = _controller("vpp-pack")
    _admit(controller, _chunk(0, "a", 0))
    assert controller.admission(_chunk(1, "b", 0)) is Admission.NO


def test_order_rules():
    layout_pp = 2
    drain = _controller("vpp", layout_pp)
    feed = _controller("vpp-async", layout_pp)
    ready = [(0, 5), (3, 3)]  # rank 0: stage 0 of a new micro-batch, fold-back of an older one
    assert drain.pick(0, ready) == (3, 3)
    assert feed.pick(0, ready) == (0, 5)
    middle = _controller("vpp-async", 4)
    assert middle.pick(1, [(1, 6), (6, 2)]) == (6, 2)  # both feed a peer: the oldest


def test_batch_budget_is_the_next_cut_or_a_whole_chunk_when_the_request_ends():
    from sglang_vpp.schedule import FixedChunker

    layout = build_layout(2, 8, "foldback")
    controller = Controller(get_policy("vpp-pack"), layout, LinearTau(), chunker=FixedChunker(64))
    assert controller.batch_budget(0, 300, 16384) == 64  # a middle chunk: its own size
    assert controller.batch_budget(256, 44, 16384) == 64  # the last piece: the rest is fillable
    assert controller.batch_budget(256, 44, 50) == 50  # never above SGLang's prefill limit


@pytest.mark.parametrize("fold", ["split", "fused"])
def test_ready_items_list_the_item_come_back_first_at_each_ranks_own_stages(fold):
    """The order a server rank lists its ready items in (its trace's ``pick`` records): the
    micro-batch come back up the V at the rank's later stage, then the one going down at its
    earlier stage (rank 0: the held batch at stage 0); the fused fold's last rank has one
    stage for both."""
    pp = 3
    layout = build_layout(pp, 4 * pp, "vpp", fold=fold)
    controller = Controller(get_policy("vpp-stream"), layout, LinearTau())
    last = layout.last_stage
    assert controller.ready_items(0, 7, 9) == [(last, 7), (0, 9)]
    assert controller.ready_items(1, 4, None) == [(last - 1, 4)]
    assert controller.ready_items(1, None, 5) == [(1, 5)]
    assert controller.ready_items(1, None, None) == []
    fold_rank = pp - 1
    expected = [(last - fold_rank, 2), (fold_rank, 3)]
    assert controller.ready_items(fold_rank, 2, 3) == expected
    assert (expected[0][0] == expected[1][0]) == (fold == "fused")
