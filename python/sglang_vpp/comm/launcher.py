"""Spawn N local ranks, run one function on each, collect results; never leave a process behind.

``run_ranks(target, world_size, ...)`` starts one process per rank (``forkserver`` with torch
preloaded: a rank starts in tens of milliseconds instead of re-importing torch), initialises the
default gloo process group through a ``FileStore`` in a fresh temporary directory (no port to pick,
no port race), calls ``target(rank, world_size, *args, **kwargs)`` and sends back the return value
or the exception (``CommError``s pickle with their fields) over a pipe.

The parent waits for every rank up to ``timeout_s``. In ``finally`` it terminates, then kills,
every child still alive and joins it, so a test that fails or times out leaves no orphan. A rank
that dies without a result (``os._exit``, a crash, a kill) is reported with its exit code.

Used by the conformance tests, ``sglang-vpp doctor`` and the device runners.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

__all__ = ["RankOutcome", "LaunchResult", "run_ranks", "RanksFailed"]

_PRELOAD = ["torch", "torch.distributed", "sglang_vpp.comm"]


@dataclass
class RankOutcome:
    """What one rank returned or raised."""

    rank: int
    ok: bool
    value: Any = None
    error: BaseException | None = None
    error_type: str = ""
    traceback: str = ""
    exitcode: int | None = None
    elapsed_s: float = 0.0


class RanksFailed(RuntimeError):
    """At least one rank raised, died or was killed; the message holds each failure."""


@dataclass
class LaunchResult:
    outcomes: list[RankOutcome]
    elapsed_s: float
    timed_out: bool = False
    pids: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def values(self) -> list[Any]:
        """Return values by rank; raises ``RanksFailed`` if any rank failed."""
        self.raise_on_failure()
        return [o.value for o in self.outcomes]

    def describe(self) -> str:
        lines = [f"{len(self.outcomes)} ranks, {self.elapsed_s:.2f}s" + (", TIMED OUT" if self.timed_out else "")]
        for o in self.outcomes:
            status = "ok" if o.ok else f"FAILED ({o.error_type or 'no result'}, exit {o.exitcode})"
            lines.append(f"  rank {o.rank}: {status}")
            if not o.ok:
                lines.append("    " + (o.traceback or str(o.error)).strip().replace("\n", "\n    "))
        return "\n".join(lines)

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise RanksFailed(self.describe())


def _resolve(target: str | Callable[..., Any]) -> Callable[..., Any]:
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _picklable(error: BaseException) -> BaseException | None:
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # an exception that cannot travel: the traceback text still does
        return None


def _child_main(target: str | Callable[..., Any], rank: int, world_size: int, store_path: str,
                args: tuple[Any, ...], kwargs: dict[str, Any], env: dict[str, str], sys_path: list[str],
                init_timeout_s: float, threads: int, conn: Any) -> None:
    os.environ.update(env)
    for entry in reversed(sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    started = time.monotonic()
    payload: tuple[Any, ...]
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        fn = _resolve(target)
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=init_timeout_s))
        value = fn(rank, world_size, *args, **kwargs)
        payload = ("ok", value, None, "", "", time.monotonic() - started)
    except BaseException as error:  # report everything, including KeyboardInterrupt and SystemExit
        payload = ("error", None, _picklable(error), type(error).__name__, traceback.format_exc(),
                   time.monotonic() - started)
    try:
        conn.send(payload)
    except Exception as error:  # the value did not pickle
        conn.send(("error", None, None, "UnpicklableResult", f"result of rank {rank} did not pickle: {error}",
                   time.monotonic() - started))
    conn.close()
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # exiting anyway
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: a channel thread stuck in a transport wait (a negative control) must not delay exit.
    os._exit(0)


def run_ranks(target: str | Callable[..., Any], world_size: int, *, args: Sequence[Any] = (),
              kwargs: Mapping[str, Any] | None = None, timeout_s: float = 60.0,
              env: Mapping[str, str] | None = None, sys_path: Sequence[str] = (),
              init_timeout_s: float = 30.0, threads_per_rank: int = 1,
              start_method: str = "forkserver") -> LaunchResult:
    """Run ``target(rank, world_size, *args, **kwargs)`` on ``world_size`` local processes.

    ``target``: a module-level function or ``"module:function"`` (importable in the children;
    add directories with ``sys_path``). ``env``: extra environment for the children (``LOCAL_RANK``
    and ``LOCAL_WORLD_SIZE`` are set per rank). Returns a ``LaunchResult``; never raises for a
    rank's failure (use ``.values()`` or ``.raise_on_failure()``)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}. Fix: pass e.g. 2.")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    workdir = tempfile.mkdtemp(prefix="vpp-ranks-")
    store_path = os.path.join(workdir, "store")
    started = time.monotonic()
    deadline = started + timeout_s
    processes: list[Any] = []
    conns: dict[Any, int] = {}
    payloads: dict[int, tuple[Any, ...]] = {}
    timed_out = False
    try:
        for rank in range(world_size):
            child_env = {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world_size), **dict(env or {})}
            receiver, sender = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_child_main, name=f"vpp-rank{rank}",
                args=(target, rank, world_size, store_path, tuple(args), dict(kwargs or {}), child_env,
                      list(sys_path), init_timeout_s, threads_per_rank, sender))
            process.start()
            sender.close()
            processes.append(process)
            conns[receiver] = rank
        sentinels = {p.sentinel: rank for rank, p in enumerate(processes)}
        while conns:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            waiting = list(conns) + [s for s, r in sentinels.items() if r in conns.values()]
            for ready in mp.connection.wait(waiting, timeout=remaining):
                if ready in conns:
                    rank = conns.pop(ready)
                    try:
                        payloads[rank] = ready.recv()
                    except (EOFError, OSError):
                        pass  # died before sending: reported from its exit code below
                elif sentinels.get(ready) in conns.values():
                    rank = sentinels[ready]
                    receiver = next(c for c, r in conns.items() if r == rank)
                    if receiver.poll(0):
                        try:
                            payloads[rank] = receiver.recv()
                        except (EOFError, OSError):
                            pass
                    conns.pop(receiver)
        for process in processes:  # they exit right after reporting
            process.join(max(0.0, min(5.0, deadline - time.monotonic())))
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for receiver in conns:
            receiver.close()
        shutil.rmtree(workdir, ignore_errors=True)
    outcomes = []
    for rank, process in enumerate(processes):
        payload = payloads.get(rank)
        if payload is None:
            why = "killed after the launcher timeout" if timed_out and process.exitcode in (None, -15, -9) \
                else f"exited with code {process.exitcode} without a result"
            outcomes.append(RankOutcome(rank, False, error_type="NoResult", traceback=f"rank {rank} {why}",
                                        exitcode=process.exitcode))
            continue
        status, value, error, error_type, trace, elapsed = payload
        outcomes.append(RankOutcome(rank, status == "ok", value=value, error=error, error_type=error_type,
                                    traceback=trace, exitcode=process.exitcode, elapsed_s=elapsed))
    return LaunchResult(outcomes, time.monotonic() - started, timed_out, [p.pid for p in processes])
