"""The warm bench_serving worker (``serving/bench_worker.py``): one process runs pass after pass
with each pass's output in its own log and its own exit status; a pass past its timeout kills the
worker, a dead worker is replaced, and none outlives ``close``."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from sglang_vpp.serving.bench_worker import BenchServingWorker

pytest.importorskip("sglang.benchmark.serving", reason="the worker runs SGLang's bench_serving")

BENCH = [sys.executable, "-m", "sglang.benchmark.serving"]
IMPORT_TIMEOUT_S = 300.0  # the worker imports SGLang once: seconds here, never minutes


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers signal 0: it has exited once its state reads Z.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_one_worker_runs_passes_in_turn_each_into_its_own_log(tmp_path):
    first, second, third = (tmp_path / f"pass-{i}.log" for i in range(3))
    with BenchServingWorker() as worker:
        assert worker.run([*BENCH, "--help"], first, IMPORT_TIMEOUT_S) == 0
        pid = worker.pid
        assert pid is not None
        assert worker.run([*BENCH, "--no-such-flag"], second, IMPORT_TIMEOUT_S) == 2  # argparse's status
        assert worker.run([sys.executable, "-m", "json.tool"], third, IMPORT_TIMEOUT_S) == 2
        assert worker.pid == pid  # imported once, all three passes in it
    assert worker.pid is None and _gone(pid)
    help_text = "show this help message and exit"  # argparse's full help, not its usage line
    assert help_text in first.read_text() and "unrecognized arguments" not in first.read_text()
    assert "unrecognized arguments: --no-such-flag" in second.read_text() and help_text not in second.read_text()
    assert "runs `python -m sglang.benchmark.serving`" in third.read_text()


def test_a_pass_past_its_timeout_kills_the_worker_and_the_next_pass_starts_a_fresh_one(tmp_path):
    log = tmp_path / "pass.log"
    with BenchServingWorker() as worker:
        # The first pass waits for SGLang's import, far longer than 0.2 s.
        with pytest.raises(TimeoutError, match="ran past 0.2 s"):
            worker.run([*BENCH, "--help"], log, 0.2)
        assert worker.pid is None
        assert worker.run([*BENCH, "--help"], log, IMPORT_TIMEOUT_S) == 0


def test_a_worker_killed_between_passes_is_replaced(tmp_path):
    log = tmp_path / "pass.log"
    with BenchServingWorker() as worker:
        assert worker.run([*BENCH, "--help"], log, IMPORT_TIMEOUT_S) == 0
        killed = worker.pid
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while worker.pid is not None and time.monotonic() < deadline:  # until the kill has landed
            time.sleep(0.05)
        assert worker.run([*BENCH, "--help"], log, IMPORT_TIMEOUT_S) == 0
        assert worker.pid not in (None, killed)
