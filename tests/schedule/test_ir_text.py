import json

import pytest

from sglang_vpp.schedule import (
    Action,
    ActionKind,
    ParseError,
    ScheduleError,
    build_schedule,
    compute,
    parse_rank_lines,
    recv,
    schedule_from_json,
    schedule_to_json,
    schedule_to_text,
    send,
)


@pytest.mark.parametrize(
    "text, action",
    [
        ("3F1.0", compute(3, 1, 0)),
        ("0SEND_F1.0>1@fwd", send(0, 1, 0, 1, "fwd")),
        ("2RECV_F12.34<1@bwd", recv(2, 12, 34, 1, "bwd")),
        ("0SEND_F0.7>1@pp", send(0, 0, 7, 1, "pp")),
    ],
)
def test_action_parse_round_trip(text, action):
    assert Action.parse(text) == action
    assert str(action) == text
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize("bad", ["", "F1.0", "3X1.0", "0SEND_F1.0<1@fwd", "0SEND_F1.0", "1RECV_F1.0>0@fwd", "3F1"])
def test_action_parse_rejects(bad):
    with pytest.raises(ParseError):
        Action.parse(bad)


def test_action_invariants():
    with pytest.raises(ScheduleError):
        Action(ActionKind.SEND, 0, 0, 0)  # no peer / group
    with pytest.raises(ScheduleError):
        Action(ActionKind.COMPUTE, 0, 0, 0, peer=1, group="fwd")
    with pytest.raises(ScheduleError):
        send(0, 0, 0, 1, "sideways")


@pytest.mark.parametrize("policy", ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"])
def test_schedule_json_and_text_round_trip(policy):
    plan = build_schedule(policy, 2, 8, [700, 300], 128)
    data = json.loads(json.dumps(schedule_to_json(plan)))
    again = schedule_from_json(data)
    assert again.rank_actions == plan.rank_actions
    assert again.chunks == plan.chunks
    assert again.layout == plan.layout
    assert again.comm_semantics == plan.comm_semantics
    parsed = parse_rank_lines(schedule_to_text(plan).splitlines())
    assert tuple(tuple(r) for r in parsed) == plan.rank_actions


def test_schedule_from_bad_json():
    with pytest.raises(ParseError):
        schedule_from_json({"policy": "vpp"})
