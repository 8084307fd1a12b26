"""One warm interpreter that runs bench_serving command lines in turn.

Importing ``sglang.benchmark.serving`` pulls in most of SGLang (about 8-13 s on a 2-vCPU host)
while a pass of a small load lasts about a second, so starting ``python -m sglang.benchmark.serving``
per pass spent most of every pass importing. A worker imports it once and then runs each pass's
command line (``LoadPlan.argv``: the same argv a fresh process would get) by calling the module's
own entry point, with the pass's log as its stdout and stderr. Every pass starts from the same
state as a fresh process where it matters: bench_serving seeds ``random`` and ``numpy`` from
``--seed`` and builds its client session, tokenizer and dataset inside each run, and the two
functions ``file_load`` replaces are put back before every pass.

Protocol (one JSON object per line): the parent writes ``{"argv": [...], "log": PATH}`` to the
worker's stdin; the worker answers ``{"rc": N}`` (the exit status the command would have had) on
its own copy of the stdout it was started with. fds 1 and 2 point at the pass's log while a pass
runs and at ``/dev/null`` between passes, so nothing a pass prints can reach the answer channel.

The parent bounds each answer by the pass's timeout and kills the worker when it runs past it (the
next pass starts a fresh one); the worker dies with its parent (``die_with_parent``) and leaves its
loop when its stdin closes.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, BinaryIO

from ..parent_death import die_with_parent

__all__ = ["BenchServingWorker", "WorkerDied"]

_BENCH_SERVING = "sglang.benchmark.serving"
_FILE_LOAD = f"{__package__}.file_load"
_KILL_WAIT_S = 10.0


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
        process = self._process if self._process is not None and self._process.poll() is None else self._start(log_file)
        deadline = time.monotonic() + timeout
        try:
            assert process.stdin is not None
            process.stdin.write((json.dumps({"argv": argv, "log": str(log_file)}) + "\n").encode())
            process.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None
        line = self._read_line(deadline)
        if line is None:
            self.close()
            raise TimeoutError(f"bench_serving ran past {timeout:g} s")
        if not line:
            raise self._died()
        return int(json.loads(line)["rc"])

    def close(self) -> None:
        """Stop the worker (stdin closed, then killed if it does not leave at once) and wait for it."""
        process, self._process, self._pending = self._process, None, b""
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=_KILL_WAIT_S)

    def _start(self, log_file: Path) -> subprocess.Popen[bytes]:
        self.close()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("ab") as log:  # the import's own warnings and errors land in the first pass's log
            self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=log, preexec_fn=die_with_parent)
        return self._process

    def _read_line(self, deadline: float) -> bytes | None:
        """The next answer line; ``b""`` at end of file, ``None`` past the deadline."""
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return b""
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _died(self) -> WorkerDied:
        process, self._process, self._pending = self._process, None, b""
        code = None
        if process is not None:
            try:
                code = process.wait(timeout=_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait(timeout=_KILL_WAIT_S)
        return WorkerDied(f"the bench_serving worker ended without an answer (exit {code})")


# --- the worker's side --------------------------------------------------------------------------


def _exit_status(caught: SystemExit) -> int:
    """What the interpreter would exit with for ``caught`` (a message goes to stderr, status 1)."""
    if caught.code is None:
        return 0
    if isinstance(caught.code, int):
        return caught.code
    print(caught.code, file=sys.stderr)
    return 1


def _run_command(bench: Any, argv: list[str]) -> int:
    """``argv`` as ``python -m MODULE ARGS`` would run it, for the two modules a pass runs."""
    if argv[1:2] != ["-m"] or len(argv) < 3 or argv[2] not in (_BENCH_SERVING, _FILE_LOAD):
        print(f"error: the bench_serving worker runs `python -m {_BENCH_SERVING}` or `-m {_FILE_LOAD}`, "
              f"not {argv[:3]}", file=sys.stderr)
        return 2
    module, args = argv[2], argv[3:]
    sys.argv = [module, *args]
    try:
        if module == _FILE_LOAD:
            importlib.import_module(_FILE_LOAD).main(args)
        else:
            bench.cli_main()
    except SystemExit as caught:
        return _exit_status(caught)
    except Exception:  # the traceback a fresh process would print; KeyboardInterrupt still ends the worker
        traceback.print_exc()
        return 1
    return 0


def _run_logged(bench: Any, argv: list[str], log: str, quiet_fd: int) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "ab", buffering=0) as out:
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
        try:
            return _run_command(bench, argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd in (1, 2):
                os.dup2(quiet_fd, fd)


def _serve(commands: BinaryIO, answers: BinaryIO) -> None:
    bench = importlib.import_module(_BENCH_SERVING)
    originals = (bench.get_dataset, bench.get_request)
    quiet_fd = os.open(os.devnull, os.O_WRONLY)
    for line in commands:
        request = json.loads(line)
        bench.get_dataset, bench.get_request = originals  # a workload-file pass hooks them for itself
        rc = _run_logged(bench, list(request["argv"]), str(request["log"]), quiet_fd)
        answers.write((json.dumps({"rc": rc}) + "\n").encode())
        answers.flush()


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints between passes go where stderr goes, never into the answers
    _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
