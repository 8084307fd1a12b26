"""The warm bench_serving worker (``serving/bench_worker.py``): one process runs pass after pass,
each into its own log with the exit status a fresh process would have; a pass's changes to the
interpreter (hooked functions, ``sys.stdout``) do not reach the next; a pass past its timeout or
a worker that dies is a clear error and the next pass gets a fresh worker; none outlives
``close``.

Most tests run the worker on a stand-in ``sglang.benchmark.serving`` (first on the child's path),
whose ``cli_main`` does what its first argument says, so they take a second; one test runs
SGLang's own."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time

import pytest

from sglang_vpp.serving.bench_serving import BenchServeError, LoadPlan, Workload, run_pass
from sglang_vpp.serving.bench_worker import BENCH_SERVING_MODULE, BenchServingWorker, WorkerDied

BENCH = [sys.executable, "-m", BENCH_SERVING_MODULE]
TIMEOUT_S = 60.0  # a stand-in pass takes milliseconds; the worker's start well under a second

STAND_IN = '''
import asyncio, dataclasses, json, os, sys, time

@dataclasses.dataclass
class DatasetRow:  # what file_load checks for
    prompt: str = ""
    timestamp: float = 0.0

async def get_request(*args, **kwargs):
    yield None

def get_dataset(*args, **kwargs):
    return "original"

ORIGINALS = (get_dataset, get_request)

def cli_main():
    global get_dataset
    args = sys.argv[1:]
    action = os.environ.get("STAND_IN_ACTION") if not args or args[0].startswith("--") else args.pop(0)
    if action == "print":
        print(*args)
    elif action == "exit":
        sys.exit(int(args[0]) if args[0].lstrip("-").isdigit() else args[0])
    elif action == "raise":
        raise ValueError("boom")
    elif action == "cancel":
        raise asyncio.CancelledError()
    elif action == "sleep":
        time.sleep(float(args[0]) if args and not args[0].startswith("--") else 60)
    elif action == "die":
        print("dying", flush=True)
        os._exit(7)
    elif action == "hook":
        get_dataset = lambda *a, **k: "hooked"
    elif action == "hooks":
        print("originals" if (get_dataset, get_request) == ORIGINALS else "hooked")
    elif action == "rebind-stdout":
        sys.stdout = open(os.devnull, "w")
    elif action == "close-stderr-and-raise":
        sys.stderr.close()
        raise ValueError("after close")
    elif action == "read-stdin":
        print("stdin:", repr(sys.stdin.read()))
    elif action == "pid":
        print(os.getpid())
    elif action == "jsonl":
        out = args[args.index("--output-file") + 1]
        with open(out, "a") as f:
            f.write(json.dumps({"completed": 1, "ttfts": [0.5], "itls": [[0.1]], "input_lens": [8],
                                "output_lens": [2], "errors": [""], "generated_texts": ["ab"]}) + "\\n")
    else:
        raise SystemExit(f"stand-in: unknown action {action!r}")
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """A ``sglang.benchmark.serving`` stand-in first on the path the worker inherits."""
    root = tmp_path / "stand-in"
    (root / "sglang" / "benchmark").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "benchmark" / "__init__.py").write_text("")
    (root / "sglang" / "benchmark" / "serving.py").write_text(textwrap.dedent(STAND_IN))
    (root / "sglang" / "benchmark" / "datasets").mkdir()
    (root / "sglang" / "benchmark" / "datasets" / "__init__.py").write_text("")
    (root / "sglang" / "benchmark" / "datasets" / "random.py").write_text("def sample_random_requests(**kwargs):\n"
                                                                          "    return []\n")
    monkeypatch.syspath_prepend(str(root))
    return root


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:  # a zombie still answers signal 0
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_passes_run_in_turn_in_one_process_each_into_its_own_log_with_its_exit_status(stand_in, tmp_path):
    cases = [(["print", "hello"], 0, "hello"), (["exit", "3"], 3, ""), (["exit", "256"], 0, ""),
             (["exit", "bad input"], 1, "bad input"), (["raise"], 1, "ValueError: boom"),
             (["cancel"], 1, "CancelledError"), (["pid"], 0, "")]  # fmt: skip
    logs = [tmp_path / f"pass-{i}.log" for i in range(len(cases))]
    with BenchServingWorker() as worker:
        statuses = [worker.run([*BENCH, *args], log, TIMEOUT_S) for (args, _, _), log in zip(cases, logs)]
        pid = worker.pid
    assert statuses == [rc for _, rc, _ in cases]
    for (_, _, text), log in zip(cases, logs):
        assert text in log.read_text()
    assert "hello" not in logs[1].read_text() and "boom" not in logs[6].read_text()
    assert logs[-1].read_text().strip() == str(pid)  # the last pass ran in the first one's process
    assert worker.pid is None and _gone(pid)


def test_a_pass_does_not_change_what_the_next_one_runs_with(stand_in, tmp_path):
    hooks, rebound, printed, stdin, closed = (tmp_path / f"{name}.log"
                                              for name in ("hooks", "rebound", "printed", "stdin", "closed"))
    with BenchServingWorker() as worker:
        assert worker.run([*BENCH, "hook"], tmp_path / "hook.log", TIMEOUT_S) == 0
        assert worker.run([*BENCH, "hooks"], hooks, TIMEOUT_S) == 0
        assert worker.run([*BENCH, "rebind-stdout"], rebound, TIMEOUT_S) == 0
        assert worker.run([*BENCH, "print", "after"], printed, TIMEOUT_S) == 0
        assert worker.run([*BENCH, "read-stdin"], stdin, TIMEOUT_S) == 0  # reads nothing, blocks nothing
        assert worker.run([*BENCH, "print", "still"], printed, TIMEOUT_S) == 0
        assert worker.run([*BENCH, "close-stderr-and-raise"], closed, TIMEOUT_S) == 1
        assert worker.run([*BENCH, "print", "last"], printed, TIMEOUT_S) == 0
    assert hooks.read_text().strip() == "originals"
    assert printed.read_text().split() == ["after", "still", "last"]
    assert "ValueError: after close" in closed.read_text()  # its traceback, though it closed sys.stderr
    assert stdin.read_text().strip() == "stdin: ''"


def test_a_workload_file_pass_hooks_bench_serving_for_itself_only(stand_in, tmp_path):
    from sglang_vpp.serving.bench_worker import FILE_LOAD_MODULE
    from sglang_vpp.serving.file_load import WORKLOAD_FILE_FLAG

    workload = tmp_path / "load.jsonl"
    workload.write_text('{"length": 8, "arrival": 0.0}\n')
    file_pass, plain_pass = tmp_path / "file.log", tmp_path / "plain.log"
    with BenchServingWorker() as worker:
        file_argv = [sys.executable, "-m", FILE_LOAD_MODULE, WORKLOAD_FILE_FLAG, str(workload), "hooks"]
        assert worker.run(file_argv, file_pass, TIMEOUT_S) == 0
        assert worker.run([*BENCH, "hooks"], plain_pass, TIMEOUT_S) == 0
    assert file_pass.read_text().strip() == "hooked"
    assert plain_pass.read_text().strip() == "originals"


def test_only_the_two_modules_a_pass_runs_are_run(stand_in, tmp_path):
    log = tmp_path / "pass.log"
    with BenchServingWorker() as worker:
        assert worker.run([sys.executable, "-m", "json.tool"], log, TIMEOUT_S) == 2
    assert f"runs `python -m {BENCH_SERVING_MODULE}`" in log.read_text()


def test_a_pass_past_its_timeout_kills_the_worker_and_the_next_pass_starts_a_fresh_one(stand_in, tmp_path):
    log = tmp_path / "pass.log"
    with BenchServingWorker() as worker:
        assert worker.run([*BENCH, "print", "warm"], log, TIMEOUT_S) == 0
        stuck = worker.pid
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="ran past 0.5 s"):
            worker.run([*BENCH, "sleep", "60"], log, 0.5)
        assert time.monotonic() - started < 30  # killed, not waited out
        assert worker.pid is None and _gone(stuck)
        assert worker.run([*BENCH, "print", "fresh"], log, TIMEOUT_S) == 0
        assert worker.pid not in (None, stuck)


def test_a_worker_that_dies_mid_pass_or_between_passes_is_an_error_then_replaced(stand_in, tmp_path):
    log = tmp_path / "pass.log"
    with BenchServingWorker() as worker:
        with pytest.raises(WorkerDied, match=r"exit 7"):
            worker.run([*BENCH, "die"], log, TIMEOUT_S)
        assert worker.run([*BENCH, "print", "again"], log, TIMEOUT_S) == 0
        killed = worker.pid
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while worker.pid is not None and time.monotonic() < deadline:  # until the kill has landed
            time.sleep(0.05)
        assert worker.run([*BENCH, "print", "replaced"], log, TIMEOUT_S) == 0
        assert worker.pid not in (None, killed)
    text = log.read_text()
    assert text.index("dying") < text.index("again") < text.index("replaced")


def _plan(timeout: float = TIMEOUT_S) -> LoadPlan:
    return LoadPlan(workload=Workload.SHORT, num_requests=1, input_len=8, output_len=2, concurrency=1, warmup=0,
                    progress=False, timeout=timeout)


def test_run_pass_reads_the_pass_back_and_names_a_timeout_or_a_dead_worker(stand_in, tmp_path, monkeypatch):
    out, log = tmp_path / "bench.jsonl", tmp_path / "bench.log"
    monkeypatch.setenv("STAND_IN_ACTION", "jsonl")
    with BenchServingWorker() as worker:
        serving_pass = run_pass(_plan(), "http://127.0.0.1:1", out, log, worker=worker)
        assert serving_pass.ttfts == [0.5] and serving_pass.num_requests == 1
        assert json.loads(out.read_text())["completed"] == 1
    assert log.read_text().startswith(f"$ {sys.executable} -m {BENCH_SERVING_MODULE} --backend sglang")

    monkeypatch.setenv("STAND_IN_ACTION", "sleep")
    with pytest.raises(BenchServeError, match=r"ran past --timeout 0.5 s"):
        run_pass(_plan(0.5), "http://127.0.0.1:1", out, log)
    monkeypatch.setenv("STAND_IN_ACTION", "die")
    with pytest.raises(BenchServeError, match=r"ended without an answer, exit 7\): dying"):
        run_pass(_plan(), "http://127.0.0.1:1", out, log)


def test_a_worker_that_cannot_import_bench_serving_names_the_import_error(stand_in, tmp_path):
    (stand_in / "sglang" / "benchmark" / "serving.py").write_text("raise ImportError('no module named vllm_stub')\n")
    with pytest.raises(BenchServeError, match=r"exit 1\): ImportError: no module named vllm_stub"):
        run_pass(_plan(), "http://127.0.0.1:1", tmp_path / "bench.jsonl", tmp_path / "bench.log")


@pytest.mark.slow
@pytest.mark.sglang
def test_sglangs_own_bench_serving_runs_pass_after_pass_in_one_worker(tmp_path):
    pytest.importorskip(BENCH_SERVING_MODULE, reason="the worker runs SGLang's bench_serving")
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with BenchServingWorker() as worker:
        assert worker.run([*BENCH, "--help"], first, 300.0) == 0
        pid = worker.pid
        assert worker.run([*BENCH, "--no-such-flag"], second, 300.0) == 2  # argparse's status
        assert worker.pid == pid
    help_text = "show this help message and exit"  # argparse's full help, not its usage line
    assert help_text in first.read_text() and "unrecognized arguments" not in first.read_text()
    assert "unrecognized arguments: --no-such-flag" in second.read_text() and help_text not in second.read_text()
