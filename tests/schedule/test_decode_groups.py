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


def test_controller_decode_join_is_the_groups_rule():
    controller = _controller("vpp-pack", 2)
    assert controller.decode_join({0: 4, 3: 1}) == 3


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
