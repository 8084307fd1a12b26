"""One warm interpreter that runs bench_serving command lines in turn.

Importing ``sglang.benchmark.serving`` pulls in most of SGLang (8-13 s on a 2-vCPU host, inside
the first pass's timeout) while a pass of a small load lasts about a second, so the passes of
one command share a process that imports it once. That process runs each pass's command line
(``LoadPlan.argv``, the argv a fresh ``python -m`` process would get) by calling the module's
own entry point, with the pass's log as its stdout and stderr. Where it matters a pass starts
from what a fresh process would: bench_serving seeds ``random`` and ``numpy`` from ``--seed``
and builds its client sessions, tokenizer and dataset inside each run; the worker gives each
pass its own ``sys.stdout`` / ``sys.stderr`` (a pass that rebinds or closes them leaves the next
one alone) and puts back ``sys.argv`` and the two functions ``file_load`` replaces. What does
carry over is harmless to the load: a warning Python shows once per interpreter lands only in
the first pass's log.

Protocol, one JSON object per line: the parent writes ``{"argv": [...], "log": PATH}``; the worker
answers ``{"rc": N}``, the exit status the command would have had. Commands come on a copy of
the worker's stdin and answers go on a copy of its stdout; fd 0 is ``/dev/null`` and fds 1 and
2 are the pass's log while a pass runs and ``/dev/null`` between passes, so no pass can read a
command or write into an answer.

Its first act is ``die_with_parent`` and a check that its parent is still the one that started
it (as ``plan_child`` does, and for the same reasons: no ``preexec_fn``, which would fork a
threaded parent). The parent bounds each answer by the pass's timeout and kills the worker past
it (the next pass starts a fresh one); ``close`` ends it at once, since nothing in it is unsaved
(answers are flushed, logs unbuffered), where an orderly exit of an interpreter holding SGLang
takes seconds.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import selectors
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ..child_env import child_environment
from ..parent_death import die_with_parent

__all__ = ["BENCH_SERVING_MODULE", "FILE_LOAD_MODULE", "BenchServingWorker", "WorkerDied"]

BENCH_SERVING_MODULE = "sglang.benchmark.serving"
FILE_LOAD_MODULE = f"{__package__}.file_load"
_REAP_TIMEOUT_S = 10.0


class WorkerDied(RuntimeError):
    """The worker process ended without answering (killed, out of memory, an import failure)."""


class BenchServingWorker:
    """The parent's side: starts the worker on the first pass and keeps it for the next ones.

    Use as a context manager (or call ``close``) so no worker outlives the command.
    """

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = b""

    def __enter__(self) -> BenchServingWorker:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None before the first pass and after ``close``)."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def run(self, argv: list[str], log_file: Path, timeout: float) -> int:
        """Run one bench_serving command line; its exit status. ``TimeoutError`` past ``timeout``
        seconds (the worker is then killed), ``WorkerDied`` if the worker ended mid-pass."""
        deadline = time.monotonic() + timeout
        command = (json.dumps({"argv": argv, "log": str(log_file)}) + "\n").encode()
        for fresh in (False, True):
            process = self._process if self.pid is not None and not fresh else self._start(log_file)
            try:
                assert process.stdin is not None
                process.stdin.write(command)
                process.stdin.flush()
                break
            except BrokenPipeError:  # it died between passes, before taking this one
                if fresh:
                    raise self._died() from None
        line = self._read_line(deadline)
        if line is None:
            self.close()
            raise TimeoutError(f"bench_serving ran past {timeout:g} s")
        if not line:
            raise self._died()
        return int(json.loads(line)["rc"])

    def close(self, grace_s: float = 0.0) -> int | None:
        """Kill the worker (after ``grace_s`` seconds for it to end by itself) and reap it; its exit
        status (None if none was running)."""
        process, self._process, self._pending = self._process, None, b""
        if process is None:
            return None
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        return process.wait(timeout=_REAP_TIMEOUT_S)

    def _died(self) -> WorkerDied:
        # Its stdout closed: it is ending, so its own status (an import failure's 1) is worth a wait.
        return WorkerDied(f"the bench_serving worker ended without an answer, exit {self.close(_REAP_TIMEOUT_S)}")

    def _start(self, log_file: Path) -> subprocess.Popen[bytes]:
        self.close()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:  # the import's own warnings and errors land in the first pass's log
            self._process = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid())], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, env=child_environment())
        return self._process

    def _read_line(self, deadline: float) -> bytes | None:
        """The next answer line; ``b""`` at end of file, ``None`` past the deadline."""
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 4096)
                if not chunk:
                    return b""
                self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line


# --- the worker's side --------------------------------------------------------------------------


def _exit_status(caught: SystemExit) -> int:
    """The status a process exiting with ``caught`` would have (a message goes to stderr, 1)."""
    if caught.code is None:
        return 0
    if isinstance(caught.code, int):
        return caught.code & 0xFF
    print(caught.code, file=sys.__stderr__)
    return 1


def _run_command(bench: Any, argv: list[str]) -> int:
    """``argv`` as ``python -m MODULE ARGS`` would run it, for the two modules a pass runs."""
    if argv[1:2] != ["-m"] or len(argv) < 3 or argv[2] not in (BENCH_SERVING_MODULE, FILE_LOAD_MODULE):
        print(f"error: the bench_serving worker runs `python -m {BENCH_SERVING_MODULE}` or "
              f"`-m {FILE_LOAD_MODULE}`, not {argv[:3]}", file=sys.stderr)
        return 2
    module, args = argv[2], argv[3:]
    spec = importlib.util.find_spec(module)
    sys.argv = [spec.origin if spec is not None and spec.origin else module, *args]  # as ``-m`` sets it
    try:
        if module == FILE_LOAD_MODULE:
            importlib.import_module(FILE_LOAD_MODULE).main(args)
        else:
            bench.cli_main()
    except SystemExit as caught:
        return _exit_status(caught)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the worker ends with the command
        raise
    except BaseException:  # the traceback a fresh process would print, into this pass's log
        traceback.print_exc(file=sys.__stderr__)  # fd 2 is the log, whatever the pass did to sys.stderr
        return 1
    return 0


def _pass_streams() -> tuple[TextIO, TextIO]:
    """``sys.stdout`` / ``sys.stderr`` for one pass, on their own copies of fds 1 and 2, buffered as
    a fresh interpreter's are when they are a file: a pass that closes them closes only its own."""
    out = os.fdopen(os.dup(1), "w", encoding=sys.__stdout__.encoding, errors=sys.__stdout__.errors)
    err = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.__stderr__.encoding, errors="backslashreplace")
    return out, err


def _run_logged(bench: Any, argv: list[str], log: str, quiet_fd: int) -> int:
    saved = sys.argv, sys.stdout, sys.stderr
    sys.__stdout__.flush()  # what the worker itself buffered belongs where fds 1 and 2 pointed until now
    sys.__stderr__.flush()
    with open(log, "ab", buffering=0) as out:
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
        sys.stdout, sys.stderr = streams = _pass_streams()
        try:
            return _run_command(bench, argv)
        finally:
            for stream in (sys.stdout, sys.stderr, *streams, sys.__stderr__):
                try:
                    stream.flush()
                except (OSError, ValueError):  # a stream the pass closed
                    pass
            for stream in streams:
                try:
                    stream.close()
                except (OSError, ValueError):
                    pass
            sys.argv, sys.stdout, sys.stderr = saved
            for fd in (1, 2):
                os.dup2(quiet_fd, fd)


def _serve(commands: BinaryIO, answers: BinaryIO, quiet_fd: int) -> None:
    bench = importlib.import_module(BENCH_SERVING_MODULE)
    originals = (bench.get_dataset, bench.get_request)
    for line in commands:
        request = json.loads(line)
        bench.get_dataset, bench.get_request = originals  # a workload-file pass hooks them for itself
        try:
            rc = _run_logged(bench, list(request["argv"]), str(request["log"]), quiet_fd)
        except (OSError, KeyError, TypeError):  # the log cannot be opened, a malformed command
            traceback.print_exc()  # to fd 2: /dev/null between passes, the parent reports the status
            rc = 1
        answers.write((json.dumps({"rc": rc}) + "\n").encode())
        answers.flush()
        gc.collect()  # the pass's garbage goes now, not in a collection inside the next pass's timed run


def main(argv: list[str] | None = None) -> int:
    (parent_pid,) = [int(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the line above: this process was adopted
        return 1
    commands = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    quiet_fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet_fd, 0)
    # Until the first pass (the import), fd 1 is where stderr goes: the first pass's log.
    os.dup2(2, 1)
    try:
        _serve(commands, answers, quiet_fd)
    except BrokenPipeError:  # the parent went away mid-answer
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
