"""``RankPool`` / ``launch``: one process per rank, watched until every rank reported or the run stopped.

Data flow: ``RunSpec`` -> checks in the parent (mode, model path, layout against the model: a
user error surfaces in milliseconds, before any process starts) -> ``RankPool`` spawns one
process per rank (``rank_main``; start-up and communicator creation happen once per pool, so a
bench of five modes times three repeats pays them once) -> per run a job on every rank's job
queue -> monitor loop -> ``LaunchResult`` (every ``RankReport``) or ``RankFailedError``.

Failure policy (what "a crashed rank stops the run" means here):

1. A rank reports an error, or exits non-zero, or the run passes its deadline.
2. The launcher sets the abort event: every other rank leaves its current wait within half a
   second with ``RunAborted`` (or earlier with its own comm error, e.g. ``PeerDeadError`` when
   gloo sees the dead peer's sockets close) and reports it.
3. After ``Timeouts.grace_s`` the stragglers are terminated, then killed; every process is
   joined. Rank processes also carry ``PR_SET_PDEATHSIG`` so a killed launcher takes them along.
4. ``RankFailedError`` names the likely root cause first, then every rank's fate. The pool is
   closed: a later ``run`` raises.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import RankFailedError, RunConfigError, RunTimeoutError
from .models import resolve_model
from .records import RankReport
from .spec import Device, RunSpec, Timeouts

__all__ = ["LaunchResult", "PoolSpec", "RankPool", "check_spec", "launch"]

_POLL_S = 0.1
# Errors that usually follow another rank's failure, most likely cause first. RunAborted comes
# last: the launcher raises it in a rank only because another rank had failed.
_CONSEQUENCES = ("PeerDeadError", "CommTimeoutError", "TimeoutError", "CommClosedError", "RunAborted")


@dataclass(frozen=True)
class PoolSpec:
    """What the rank processes share across runs."""

    num_ranks: int
    device: Device = Device.CPU
    backend: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    num_threads: int = 1

    @classmethod
    def of(cls, spec: RunSpec) -> PoolSpec:
        return cls(spec.num_ranks, spec.device, spec.backend, spec.timeouts, spec.num_threads)

    @property
    def backend_name(self) -> str:
        from .spec import BACKEND_FOR_DEVICE

        return self.backend or BACKEND_FOR_DEVICE[self.device]


@dataclass
class LaunchResult:
    spec: RunSpec
    reports: list[RankReport]
    """One per rank, in rank order."""
    wall_s: float
    """Epoch (all ranks ready) to the last rank's last action."""
    pids: list[int] = field(default_factory=list)
    outputs: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    """``{request: (hidden [n, H], logits [V])}`` from the rank holding the last stage."""


def check_spec(spec: RunSpec) -> None:
    """Every check that needs no rank process; raises ``ValueError`` subclasses with the fix."""
    spec.check()
    source = resolve_model(spec.model, spec.seed, spec.num_layers)
    layers = source.config.num_hidden_layers
    try:
        layout = spec.layout(layers)
    except ValueError as error:
        raise RunConfigError(f"model {spec.model} ({layers} layers), mode {spec.mode}: {error}") from None
    from .control import make_planner

    make_planner(spec, layout)  # e.g. a dcpp latency curve that cannot be fitted: fail here, not in a rank


def launch(spec: RunSpec, on_progress: Callable[[int, int], None] | None = None) -> LaunchResult:
    """One run on a fresh pool (see ``RankPool`` to run several specs on one start-up)."""
    check_spec(spec)
    with RankPool(PoolSpec.of(spec)) as pool:
        return pool.run(spec, on_progress)


class RankPool:
    """``num_ranks`` rank processes that execute runs one after another."""

    def __init__(self, pool: PoolSpec, directory: str | Path | None = None) -> None:
        from .rank_main import rank_main

        self.pool = pool
        self._owned_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="sglang-vpp-")) if directory is None else Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "rendezvous").unlink(missing_ok=True)
        ctx = mp.get_context("spawn")
        self._control = [ctx.Queue() for _ in range(pool.num_ranks)]
        self._jobs = [ctx.Queue() for _ in range(pool.num_ranks)]
        self._results = ctx.Queue()
        self._abort = ctx.Event()
        self._run_id = 0
        self._up: set[int] = set()
        self.closed = False
        self.processes = [
            ctx.Process(target=rank_main, name=f"sglang-vpp-rank{rank}", daemon=True,
                        args=(rank, pool, str(self.directory), self._jobs[rank], self._control,
                              self._results, self._abort, os.getpid()))
            for rank in range(pool.num_ranks)
        ]
        for process in self.processes:
            process.start()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid or -1 for p in self.processes]

    def run(self, spec: RunSpec, on_progress: Callable[[int, int], None] | None = None) -> LaunchResult:
        """Execute ``spec`` on the pool's ranks; raises ``RankFailedError`` (and closes the pool)."""
        if self.closed:
            raise RunConfigError("this rank pool was closed after a failed run; start a new one")
        if PoolSpec.of(spec) != self.pool:
            raise RunConfigError(f"run needs pool {PoolSpec.of(spec)}, this pool is {self.pool}")
        check_spec(spec)
        self._run_id += 1
        for jobs in self._jobs:
            jobs.put((self._run_id, spec))
        monitor = _Monitor(spec, self._run_id, self.processes, self._results, self._abort, on_progress, self._up)
        try:
            reports = monitor.wait()
        except BaseException:
            self.close(failed=True)
            raise
        return LaunchResult(spec, reports, max(r.finished_s for r in reports), self.pids, _load_outputs(reports))

    def close(self, failed: bool = False) -> None:
        """Stop every rank (politely unless ``failed``), join them all, remove the pool directory."""
        if self.closed:
            return
        self.closed = True
        if not failed:
            for jobs in self._jobs:
                jobs.put(None)
            end = time.monotonic() + self.pool.timeouts.grace_s
            for p in self.processes:
                p.join(max(0.0, end - time.monotonic()))
        _stop_all(self.processes, self._abort)
        for q in self._control + self._jobs + [self._results]:
            q.cancel_join_thread()
            q.close()
        if self._owned_dir:
            shutil.rmtree(self.directory, ignore_errors=True)


class _Monitor:
    """The launcher's watch loop over the processes and the result queue, for one run."""

    def __init__(self, spec: RunSpec, run_id: int, processes: list[Any], results: Any, abort: Any,
                 on_progress: Callable[[int, int], None] | None, up: set[int]) -> None:
        self.spec, self.run_id, self.processes = spec, run_id, processes
        self.results, self.abort, self.on_progress, self.up = results, abort, on_progress, up
        self.reports: dict[int, RankReport] = {}
        self.errors: dict[int, str] = {}
        self.first_failure: tuple[int, str] | None = None

    def wait(self) -> list[RankReport]:
        timeouts = self.spec.timeouts
        limit = timeouts.run_s + (timeouts.startup_s if len(self.up) < len(self.processes) else 0.0)
        deadline = time.monotonic() + limit
        failed_at: float | None = None
        while True:
            self._drain(_POLL_S)
            now = time.monotonic()
            for rank, process in enumerate(self.processes):
                if process.exitcode not in (None, 0) and rank not in self.errors:
                    self._drain(0.2)  # its error message may still be in the pipe
                    if rank not in self.errors:
                        self.errors[rank] = _describe_exit(process.exitcode)
                        self._fail(rank, self.errors[rank])
            if self.first_failure is None and now > deadline:
                self._fail(-1, f"the run exceeded its deadline of {limit:.0f}s (Timeouts.run_s)")
            if self.first_failure is not None:
                failed_at = failed_at or now
                settled = all(r in self.errors or r in self.reports for r in range(len(self.processes)))
                if settled or now - failed_at > timeouts.grace_s:
                    self._drain(0.2)
                    raise self._error()
            elif len(self.reports) == len(self.processes):
                return [self.reports[r] for r in range(len(self.processes))]

    def _drain(self, timeout: float) -> None:
        try:
            message = self.results.get(timeout=timeout)
        except queue_module.Empty:
            return
        while True:
            self._handle(message)
            try:
                message = self.results.get_nowait()
            except queue_module.Empty:
                return

    def _handle(self, message: tuple) -> None:
        kind, run_id, rank = message[0], message[1], message[2]
        if kind == "up":
            self.up.add(rank)
        elif kind == "error":  # start-up errors (run 0) fail the current run too
            self.errors[rank] = message[3]
            self._fail(rank, message[3])
        elif run_id != self.run_id:
            return
        elif kind == "progress" and self.on_progress is not None:
            self.on_progress(message[3], message[4])
        elif kind == "report":
            self.reports[rank] = message[3]

    def _fail(self, rank: int, text: str) -> None:
        if self.first_failure is None:
            self.first_failure = (rank, text)
            self.abort.set()

    def _root_cause(self) -> tuple[int, str]:
        """The failure that most likely caused the others: a rank that died without a word, then
        a rank's own error, then comm errors and aborts (usually consequences)."""
        assert self.first_failure is not None
        if self.first_failure[0] < 0 or not self.errors:
            return self.first_failure

        def severity(item: tuple[int, str]) -> int:
            text = item[1]
            if text.startswith("process died"):
                return 0
            head = text.split(":", 1)[0]
            return 2 + _CONSEQUENCES.index(head) if head in _CONSEQUENCES else 1

        return min(sorted(self.errors.items()), key=severity)

    def _error(self) -> RankFailedError:
        rank, text = self._root_cause()
        spec = self.spec
        head = (f"pipelined run failed (mode {spec.mode}, pp {spec.num_ranks}, model {spec.model}): "
                + (f"rank {rank} failed: {text.splitlines()[0]}" if rank >= 0 else text))
        lines = [head, "every rank:"]
        for r, process in enumerate(self.processes):
            if r in self.errors:
                state = self.errors[r]
            elif r in self.reports:
                state = "finished its stream"
            else:
                state = "no report; stopped by the launcher"
            lines.append(f"  rank {r} (pid {process.pid}): " + state.replace("\n", "\n    "))
        lines.append("all rank processes were stopped and joined")
        cls = RunTimeoutError if rank < 0 else RankFailedError
        return cls("\n".join(lines), dict(self.errors))


def _load_outputs(reports: list[RankReport]) -> dict[int, tuple[Any, Any]]:
    import torch

    outputs: dict[int, tuple[Any, Any]] = {}
    for report in reports:
        if report.outputs_path:
            outputs.update(torch.load(report.outputs_path))
            Path(report.outputs_path).unlink(missing_ok=True)
    return outputs


def _stop_all(processes: list[Any], abort: Any) -> None:
    """Abort, terminate, then kill, and join every rank process still alive."""
    if any(p.is_alive() for p in processes):
        abort.set()
        end = time.monotonic() + 1.0
        for p in processes:
            if p.pid is not None:
                p.join(max(0.0, end - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 2.0
    for p in processes:
        if p.pid is not None:
            p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(2.0)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process died (killed by {name}) without a report"
    return f"process exited with code {code}"
