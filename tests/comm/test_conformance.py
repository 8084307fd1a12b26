"""Cross-backend conformance suite: the same tests on every backend available.

Parametrised over ``gloo``, the gloo-based device doubles ``nccl@double`` and ``hccl@double``
(the real NCCL/HCCL backend code over a stand-in for the hardware), and the real ``nccl`` and
``hccl``, which run where the device exists and are skipped with the probe's reason elsewhere.

Each test launches real rank processes (``launcher.run_ranks``) running a rank program from
``sglang_vpp.comm.testing.scenarios`` and asserts on what the ranks return. Negative controls use
timeouts of 1.5 to 2 s and assert that the failure is the right class, names rank, peer, group and
action, and arrives within its timeout (plus scheduling slack on this loaded 2-vCPU machine).
"""

from __future__ import annotations

import dataclasses

import pytest

from comm_support import backend_params, launch
from sglang_vpp.schedule import RequestSpec, build_schedule, check_deadlock

BACKENDS = backend_params()
# Slack on top of a timeout before we call a detection slow: process scheduling on 2 busy vCPUs.
SLACK_S = 2.5


def _ranks_params() -> list:
    params = []
    for num_ranks in (2, 4):
        for param in backend_params(min_devices=num_ranks):
            params.append(pytest.param(param.values[0], num_ranks, marks=param.marks, id=f"{param.id}-P{num_ranks}"))
    return params


RANKS_BACKENDS = _ranks_params()


def _schedule(num_ranks: int, num_chunks: int = 64):
    return build_schedule("vpp-async", num_ranks, 4 * num_ranks, [RequestSpec(num_chunks * 16)], 16)


def _check_error(error: dict, kind: str, rank: int, timeout_s: float | None = None) -> None:
    assert error is not None, "expected a failure, the operation completed"
    assert error["type"] == kind, error
    assert error["rank"] == rank and error["peer"] is not None and error["group"] and error["action"], error
    for field in (f"rank {rank}", f"group '{error['group']}'", f"peer rank {error['peer']}", error["action"]):
        assert field in error["message"], (field, error["message"])
    if timeout_s is not None:
        assert error["timeout_s"] == timeout_s
        assert timeout_s - 0.05 <= error["elapsed_s"] <= timeout_s + SLACK_S, error


@pytest.mark.parametrize("backend", BACKENDS)
def test_roundtrip_of_every_dtype_and_shape(backend: str) -> None:
    values = launch("roundtrip", 2, backend).values()
    assert values[0]["cases"] >= 90  # every dtype x 5 shapes (0-d, empty, ...) plus edge cases
    assert values[0]["problems"] == [] and values[1]["problems"] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_exchange_on_one_group_completes(backend: str) -> None:
    values = launch("exchange_single_group", 2, backend, rounds=40).values()
    assert all(v["problems"] == [] and v["rounds"] == 40 for v in values)


@pytest.mark.parametrize("backend,num_ranks", RANKS_BACKENDS)
def test_vpp_async_pattern_completes_on_two_groups(backend: str, num_ranks: int) -> None:
    schedule = _schedule(num_ranks)
    assert len(schedule.chunks) == 64 and set(schedule.groups) == {"fwd", "bwd"}
    assert not check_deadlock(schedule).deadlock  # the oracle agrees it must complete
    values = launch("schedule_pattern", num_ranks, backend, num_chunks=64, timeout_s=30.0,
                    launch_timeout_s=150.0).values()
    for rank, value in enumerate(values):
        assert value["completed"], value["error"]
        assert value["mismatches"] == [], value["mismatches"][:3]
        sends = sum(1 for a in schedule.rank_actions[rank] if a.kind.name == "SEND")
        assert value["sent"] == sends and value["sent"] > 0
    assert sum(v["sent"] for v in values) == sum(v["received"] for v in values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_control_single_group_blocking_exchange_is_reported_within_timeout(backend: str) -> None:
    timeout = 1.0
    values = launch("blocking_single_group", 2, backend, timeout_s=timeout, launch_timeout_s=60.0).values()
    for rank, value in enumerate(values):
        assert not value["completed"], "both ranks sending first on one communicator must not complete"
        _check_error(value["error"], "CommTimeoutError", rank, timeout)
        assert value["error"]["action"] == f"{rank}SEND_F0.0>{1 - rank}@pp"
        assert "has not posted the matching receive" in value["error"]["message"]


@pytest.mark.parametrize("backend,num_ranks", RANKS_BACKENDS)
def test_negative_control_vpp_async_on_one_group_is_stuck_as_the_checker_predicts(backend: str, num_ranks: int) -> None:
    schedule = _schedule(num_ranks)
    single = [[dataclasses.replace(a, group="pp") if a.is_comm else a for a in acts] for acts in schedule.rank_actions]
    assert check_deadlock(rank_actions=single, comm_semantics="async").deadlock  # the oracle
    timeout = 1.0
    values = launch("schedule_pattern", num_ranks, backend, single_group=True, timeout_s=timeout,
                    launch_timeout_s=90.0).values()
    for rank, value in enumerate(values):
        assert not value["completed"]
        error = value["error"]
        _check_error(error, "CommTimeoutError", rank)
        assert error["group"] == "pp" and error["timeout_s"] == timeout
        # A rank times out at most one timeout after its last progress; progress here is fast.
        assert error["elapsed_s"] <= timeout + SLACK_S + 2.0, error


@pytest.mark.slow
@pytest.mark.parametrize("backend,num_ranks", [("gloo", 2), ("hccl@double", 4)])
def test_blocking_sends_on_two_groups_deadlock_as_the_checker_predicts(backend: str, num_ranks: int) -> None:
    """vpp-async needs asynchronous sends as well as two groups: the checker says so, and so do we."""
    schedule = _schedule(num_ranks)
    assert check_deadlock(rank_actions=schedule.rank_actions, comm_semantics="blocking").deadlock
    values = launch("schedule_pattern", num_ranks, backend, semantics="blocking", timeout_s=1.0,
                    launch_timeout_s=90.0).values()
    assert not any(v["completed"] for v in values)
    assert {v["error"]["type"] for v in values} == {"CommTimeoutError"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_peer_is_reported_with_rank_group_and_action(backend: str) -> None:
    result = launch("dead_peer", 2, backend, timeout_s=5.0, launch_timeout_s=60.0)
    survivor, dead = result.outcomes
    assert not dead.ok and dead.exitcode == 17, dead
    assert survivor.ok, survivor.traceback
    recv_error, send_error = survivor.value["recv"], survivor.value["send"]
    _check_error(recv_error, "PeerDeadError", 0)
    assert recv_error["action"] == "0RECV_F0.0<1@fwd" and recv_error["group"] == "fwd" and recv_error["peer"] == 1
    assert recv_error["elapsed_s"] < 5.0  # detected from the closed connection, before any timeout
    assert send_error is not None and send_error["type"] in ("PeerDeadError", "CommTimeoutError"), send_error
    assert send_error["action"] == "0SEND_F0.0>1@bwd" and send_error["group"] == "bwd"


@pytest.mark.parametrize("backend", BACKENDS)
def test_stuck_peer_times_out_naming_the_operation(backend: str) -> None:
    timeout = 1.0
    values = launch("stuck_peer", 2, backend, timeout_s=timeout, launch_timeout_s=60.0).values()
    error = values[0]["error"]
    _check_error(error, "CommTimeoutError", 0, timeout)
    assert error["action"] == "1RECV_F3.2<0@fwd" and error["peer"] == 1 and error["group"] == "fwd"
    assert "has not posted the matching send" in error["message"]
    assert values[0]["ready_after_timeout"] is False  # a timed-out wait does not cancel the receive


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_stress_10000_alternating_messages_arrive_complete_and_in_order(backend: str) -> None:
    values = launch("stress", 2, backend, num_messages=10_000, launch_timeout_s=170.0).values()
    for value in values:
        assert value["problems"] == []
        assert value["received"] == 5_000


@pytest.mark.parametrize("backend", BACKENDS)
def test_teardown_recreate_and_close_with_pending_operations(backend: str) -> None:
    values = launch("teardown", 2, backend, timeout_s=3.0, launch_timeout_s=60.0).values()
    for value in values:
        assert len(set(value["first_ids"])) == len(value["first_ids"]) == 2  # fwd and bwd differ
        assert value["exchange_ok"]
        assert value["close_s"] < 2.5  # close never waits for a stuck transport
        assert value["pending_errors"] == ["CommClosedError"] * 3 and all(value["pending_ready"])
        assert value["after_close"] == "CommClosedError"
