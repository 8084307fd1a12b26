"""Decode grouping: stock PP's count of decode micro-batches, whatever the mode's slots."""

import pytest

from sglang_vpp.schedule import LinearAttentionCost, build_controller, build_layout, controller_config, get_policy
from sglang_vpp.schedule.decode_groups import DecodeGroups, decode_groups


def _controller(mode: str, pp: int):
    spec = get_policy(mode)
    layout = build_layout(pp, 8 * pp, spec.layout_kind)
    return build_controller(controller_config(spec, layout, 64, LinearAttentionCost(), 64))


@pytest.mark.parametrize("mode, pp, slots, decode", [
    ("cpp", 2, 2, (0, 1)),            # stock PP: every slot decodes, nothing regrouped
    ("vpp", 2, 3, (0, 1)),            # 2P-1 = 3 slots, P = 2 of them decode
    ("vpp-pack", 2, 6, (0, 3)),       # 2(2P-1) = 6 slots, decode every third micro-batch
    ("vpp-pack", 4, 14, (0, 3, 7, 10)),
    ("vpp-stream", 3, 10, (0, 3, 6)),
])
def test_controller_decodes_in_stock_pp_count_of_slots_evenly_spaced(mode, pp, slots, decode):
    controller = _controller(mode, pp)
    assert controller.limits.slots == slots
    assert controller.decode.decode_slots == decode
    assert controller.decode.regroups is (slots > pp)


def test_join_takes_the_least_loaded_open_slot_ties_to_the_lower():
    groups = decode_groups(6, 2)
    assert groups.join({0: 5, 3: 2}) == 3
    assert groups.join({0: 2, 3: 2}) == 0
    assert groups.join({3: 9}) == 3          # slot 0 in flight: only slot 3 can take it
    assert groups.join({}) is None           # every decode slot in flight: stays where it is


def test_join_refuses_a_prefill_only_slot():
    with pytest.raises(ValueError, match="not decode slots"):
        decode_groups(6, 2).join({1: 0})


def test_fewer_slots_than_ranks_decode_in_every_slot():
    assert decode_groups(1, 4).decode_slots == (0,)
    with pytest.raises(ValueError, match="num_slots"):
        DecodeGroups(0, (0,))
    with pytest.raises(ValueError, match="subset"):
        DecodeGroups(3, (3,))


def test_controller_decode_move_is_the_groups_rule():
    controller = _controller("vpp-pack", 2)
    move = controller.decode_move(1, prefill_ended=True, running={0: 4, 3: 1}, in_flight=())
    assert move == controller.decode.move(1, prefill_ended=True, running={0: 4, 3: 1}, in_flight=())
    assert move.chosen == 3


# vpp-pack at P = 2: 6 slots, decode in slots 0 and 3; slots 1, 2, 4, 5 run prefill only.
PACK2 = decode_groups(6, 2)


@pytest.mark.parametrize("slot, ended, running, in_flight, expected", [
    # A decode slot keeps its own requests, whatever it holds.
    (0, True, {0: 3, 3: 0}, (), None),
    (3, False, {3: 5}, (0,), None),
    # A prefill-only slot with nothing waiting to decode: nothing to decide.
    (1, False, {0: 2, 3: 1}, (), None),
    (1, False, {}, (0, 3), None),
    # A prefill ended in slot 1: the open decode slot with fewer running requests.
    (1, True, {0: 2, 3: 1}, (), ((0, 2), (3, 1), 3)),
    (1, True, {0: 1, 3: 1}, (), ((0, 1), (3, 1), 0)),         # tie: the lower slot
    (1, True, {}, (), ((0, 0), (3, 0), 0)),                   # missing: no running request
    # Slot 3's decode batch is in flight: it cannot grow, so slot 0 although fuller.
    (1, True, {0: 5, 3: 1}, (3,), ((0, 5), 0)),
    # Both in flight: the requests are held (a record with no choice; they do not decode).
    (4, True, {0: 5, 3: 1}, (0, 3), (None,)),
    # No new prefill, but slot 2 holds requests from when every decode slot was busy: at its
    # next turn they move.
    (2, False, {2: 1, 0: 2, 3: 4}, (1, 5), ((0, 2), (3, 4), 0)),
    # A prefill-only slot's own in-flight batch does not block the move.
    (5, True, {0: 0, 3: 0, 5: 2}, (5,), ((0, 0), (3, 0), 0)),
])
def test_move_on_hand_checked_cases(slot, ended, running, in_flight, expected):
    move = PACK2.move(slot, prefill_ended=ended, running=running, in_flight=in_flight)
    if expected is None:
        assert move is None
        return
    *pairs, chosen = expected
    assert move.from_slot == slot and move.running == tuple(pairs) and move.chosen == chosen


@pytest.mark.parametrize("held, running, in_flight, expected", [
    # Nothing open: every held slot stays held, nothing to record.
    ((2, 4), {0: 3, 3: 1, 2: 1, 4: 2}, (0, 3), []),
    # Slot 0's result opens it: both held slots join it, in slot order.
    ((4, 2), {0: 3, 3: 1, 2: 1, 4: 2}, (3,), [(2, ((0, 3),), 0), (4, ((0, 4),), 0)]),
    # Both open: slot 2 joins the emptier slot 3 (1 -> 2 running), and slot 4, counting it,
    # still finds slot 3 (2) emptier than slot 0 (3).
    ((2, 4), {0: 3, 3: 1, 2: 1, 4: 2}, (), [(2, ((0, 3), (3, 1)), 3), (4, ((0, 3), (3, 2)), 3)]),
    # Counting the first join moves the second: slot 2's 3 requests make slot 3 the fuller.
    ((2, 4), {0: 3, 3: 1, 2: 3, 4: 2}, (), [(2, ((0, 3), (3, 1)), 3), (4, ((0, 3), (3, 4)), 0)]),
    # A held slot whose requests all finished still leaves the hold (joining with none) ...
    ((1,), {0: 2}, (), [(1, ((0, 2), (3, 0)), 3)]),
    # ... once a decode slot opens; an empty held slot waits like any other, and counts nothing.
    ((1, 2), {0: 2, 1: 0, 2: 1}, (0, 3), []),
    ((1, 2), {0: 2, 1: 0, 2: 1}, (0,), [(1, ((3, 0),), 3), (2, ((3, 0),), 3)]),
])
def test_held_slots_join_the_first_decode_slot_that_opens(held, running, in_flight, expected):
    moves = PACK2.joins(held, running, in_flight)
    assert [(m.from_slot, m.running, m.chosen) for m in moves] == expected


def test_joins_refuse_a_decode_slot_as_held():
    with pytest.raises(ValueError, match="slot 3 is a decode slot"):
        PACK2.joins((3,), {}, ())


def test_at_most_p_decode_micro_batches_per_cycle_with_holds():
    """Every request that ends its prefill anywhere is either moved or held, so over a cycle
    of the slots only the decode slots ever carry running requests that decode."""
    running, held, decoding = {}, set(), set()
    for turn in range(60):
        slot = turn % PACK2.num_slots
        in_flight = {(slot + k) % 6 for k in (1, 2, 4)}  # a busy pipeline, varying open slots
        move = PACK2.move(slot, prefill_ended=True, running=running, in_flight=in_flight)
        if move is None:
            decoding.add(slot)
            continue
        if move.holds:
            held.add(slot)
            running[slot] = running.get(slot, 0) + 1
        else:
            running[move.chosen] = running.get(move.chosen, 0) + 1 + running.pop(slot, 0)
            held.discard(slot)
        for join in PACK2.joins(held, running, in_flight):
            running[join.chosen] = running.get(join.chosen, 0) + running.pop(join.from_slot, 0)
            held.discard(join.from_slot)
        decoding.update(s for s, n in running.items() if n and s not in held)
    assert decoding <= set(PACK2.decode_slots) and len(PACK2.decode_slots) == 2


def test_a_move_is_recorded_as_a_decode_trace_record():
    move = PACK2.move(2, prefill_ended=True, running={0: 2, 3: 1}, in_flight=(0,))
    assert move.record() == {"from_slot": 2, "running": [[3, 1]], "chosen": 3}
    kept = PACK2.move(2, prefill_ended=True, running={}, in_flight=(0, 3))
    assert kept.record() == {"from_slot": 2, "running": [], "chosen": None}


def test_move_refuses_a_slot_outside_the_cycle():
    with pytest.raises(ValueError, match="slot 6 is not one of 0..5"):
        PACK2.move(6, prefill_ended=True, running={}, in_flight=())


def test_a_server_that_does_not_decode_never_moves():
    prefill_only = decode_groups(6, 2, decodes=False)
    assert all(prefill_only.move(slot, prefill_ended=True, running={slot: 1}, in_flight=()) is None
               for slot in range(6))


def test_a_server_that_does_not_decode_moves_no_request():
    # The prefill server of a prefill-decode split never schedules running batches, so a
    # request moved into a decode slot would stay there after its KV was handed on.
    assert decode_groups(6, 2, decodes=False).decode_slots == tuple(range(6))
    assert not decode_groups(6, 2, decodes=False).regroups
    policy = get_policy("vpp-pack")
    layout = build_layout(2, 8, policy.layout_kind)
    config = controller_config(policy, layout, 64, LinearAttentionCost(), 64, batching=False, decodes=False)
    controller = build_controller(config)
    assert not controller.decodes and not controller.decode.regroups
    assert _controller("vpp-pack", 2).decode.regroups  # the same mode on a decoding server
