"""The validator on hand-written broken streams (string fixtures)."""

import pytest

from sglang_vpp.schedule import (
    ChunkSpec,
    CommSemantics,
    Policy,
    Schedule,
    ScheduleError,
    build_layout,
    find_issues,
    parse_rank_lines,
    validate_schedule,
)

GOOD = [
    "rank 0: 0F0.0 0SEND_F0.0>1@fwd 0F0.1 0SEND_F0.1>1@fwd 2RECV_F0.0<1@bwd 3F0.0 2RECV_F0.1<1@bwd 3F0.1",
    "rank 1: 0RECV_F0.0<0@fwd 1F0.0 2F0.0 2SEND_F0.0>0@bwd 0RECV_F0.1<0@fwd 1F0.1 2F0.1 2SEND_F0.1>0@bwd",
]


def _schedule(lines):
    return Schedule(
        policy=Policy.VPP_ASYNC,
        layout=build_layout(2, 4, "vpp"),
        chunks=(ChunkSpec(0, 0, 0, 8), ChunkSpec(0, 1, 8, 8, True)),
        rank_actions=tuple(tuple(r) for r in parse_rank_lines(lines)),
        comm_semantics=CommSemantics.ASYNC,
        groups=("fwd", "bwd"),
    )


def test_good_fixture_passes():
    validate_schedule(_schedule(GOOD))


@pytest.mark.parametrize(
    "old, new, fragment",
    [
        ("0RECV_F0.0<0@fwd 1F0.0", "1F0.0 0RECV_F0.0<0@fwd", "not received yet"),
        ("3F0.0 2RECV_F0.1<1@bwd 3F0.1", "2RECV_F0.1<1@bwd 3F0.1 3F0.0", "KV prefix 3F0.0"),
        ("0F0.1 0SEND_F0.1>1@fwd", "0SEND_F0.1>1@fwd 0F0.1", "before computing it"),
        ("2F0.1 2SEND_F0.1>0@bwd", "2F0.1", "hand-off"),
        ("0SEND_F0.0>1@fwd", "0SEND_F0.0>1@bwd", "carries the other direction"),
        ("3F0.1", "3F0.1 3F0.1", "runs twice"),
        ("rank 1: 0RECV_F0.0<0@fwd 1F0.0", "rank 1: 0RECV_F0.0<0@fwd 1F0.0 3F0.0", "belongs to rank 0"),
    ],
)
def test_broken_fixtures_are_reported(old, new, fragment):
    lines = [line.replace(old, new, 1) for line in GOOD]
    assert lines != GOOD
    issues = find_issues(_schedule(lines))
    assert any(fragment in issue.message for issue in issues), issues
    with pytest.raises(ScheduleError) as info:
        validate_schedule(_schedule(lines))
    assert "<-- ERROR HERE" in str(info.value) or "step -1" in str(info.value)


def test_swapped_receive_order_is_reported():
    lines = [GOOD[0].replace("2RECV_F0.0<1@bwd 3F0.0 2RECV_F0.1<1@bwd 3F0.1",
                             "2RECV_F0.1<1@bwd 2RECV_F0.0<1@bwd 3F0.0 3F0.1"), GOOD[1]]
    issues = find_issues(_schedule(lines))
    assert any("same order" in issue.message for issue in issues)


def test_missing_stage_is_reported():
    lines = [GOOD[0].replace(" 2RECV_F0.1<1@bwd 3F0.1", ""), GOOD[1]]
    messages = [i.message for i in find_issues(_schedule(lines))]
    assert any("never runs" in m for m in messages)
