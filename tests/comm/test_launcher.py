"""The rank launcher: results, failures, timeouts, and no process left behind."""

from __future__ import annotations

import time

import pytest

from comm_support import RANK_SYS_PATH, assert_no_orphans
from sglang_vpp.comm.errors import CommError
from sglang_vpp.comm.launcher import RanksFailed, run_ranks


def _run(target: str, world_size: int = 2, **kwargs):
    return run_ranks(f"rank_programs:{target}", world_size, sys_path=RANK_SYS_PATH, **kwargs)


def test_values_by_rank() -> None:
    result = _run("return_rank", 3)
    assert result.values() == [{"rank": r, "world_size": 3, "local_rank": r} for r in range(3)]
    assert_no_orphans(result.pids)


def test_a_hanging_rank_is_killed_at_the_timeout() -> None:
    started = time.monotonic()
    result = _run("hang_on_rank_one", timeout_s=2.0)
    assert time.monotonic() - started < 2.0 + 4.0
    assert result.timed_out and result.outcomes[0].ok and not result.outcomes[1].ok
    assert "killed after the launcher timeout" in result.outcomes[1].traceback
    assert_no_orphans(result.pids)
    with pytest.raises(RanksFailed, match="rank 1: FAILED"):
        result.values()


def test_exceptions_travel_with_their_fields() -> None:
    result = _run("raise_comm_error")
    error = result.outcomes[0].error
    assert isinstance(error, CommError) and error.action == "0SEND_F1.0>1@fwd" and error.group == "fwd"
    assert "synthetic" in result.outcomes[0].traceback


def test_a_dead_rank_reports_its_exit_code() -> None:
    result = _run("exit_rank_one")
    assert result.outcomes[0].ok and result.outcomes[1].exitcode == 3
    assert "exited with code 3" in result.outcomes[1].traceback
