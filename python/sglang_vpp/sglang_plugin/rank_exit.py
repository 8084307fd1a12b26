"""A scheduler that stopped after an error leaves with exit code 0, before native teardown.

A scheduler whose event loop raised (its own error, or a peer's death seen as a failed send or
receive) is done once SGLang has logged the error and sent the launcher SIGQUIT. What remains is
the interpreter's teardown: native objects (a KV transfer engine's worker threads, communicator
threads) destroyed while their threads still run end the process with SIGABRT ("terminate called
without an active exception") or leave it waiting on a thread. The launcher's failure report
would then name this survivor as a rank that was killed, and the clients would be told so,
although the failure was its peer's. So once the loop has raised, the process's first exit
handler flushes the logs and ends it at once with exit code 0, the code the failure report reads
as "ended itself after the error it logged".

The scheduler object is kept referenced from the moment the loop raised: freed earlier (when
SGLang's process function returns, or by a garbage collection before the exit handler runs), its
native members would be destroyed and could abort the process just the same. The handler runs
before the interpreter joins the threads still running (a thread pool's worker busy with a
transfer would hold the exit for as long as its task runs, past the launcher's look at its
ranks), and, since no destructor runs any more, unlinks the shared-memory segments this process
created (SGLang stamps their names with the creator's pid; a message queue of a TP group is one).
What else an exit handler or destructor would have done (publishers' close, storage shutdown) is
skipped: the launcher kills the process tree next anyway.

Data flow (each scheduler process, every mode)::

    Scheduler.run_event_loop(self)        [AROUND hook: around_run_event_loop]
        raises -> arm(self): keep the scheduler; register leave_now to run first at exit
        -> SGLang's run_scheduler_process logs the error, SIGQUITs the launcher, returns
    process exit -> leave_now(): unlink own shared memory, flush logging and stdio, os._exit(0)

A loop that returns (a graceful shutdown) or ends with a ``SystemExit`` (whose exit code the
launcher reads) arms nothing: the normal teardown runs.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import Any

__all__ = ["RUN_EVENT_LOOP_TARGET", "ENDED_AFTER_ERROR_CODE", "arm", "around_run_event_loop", "leave_now",
           "unlink_own_shared_memory"]

RUN_EVENT_LOOP_TARGET = "sglang.srt.managers.scheduler.Scheduler.run_event_loop"
ENDED_AFTER_ERROR_CODE = 0
"""The exit code of a scheduler that stopped after an error it logged (failure_report reads it)."""

_armed = False
_kept: list[Any] = []
"""What must outlive the process (destroyed by nobody): the scheduler whose loop raised."""


def unlink_own_shared_memory() -> int:
    """Unlink the /dev/shm segments this process created (best effort); returns how many."""
    from multiprocessing import shared_memory

    from sglang.srt.utils import stale_shm_cleanup

    unlinked = 0
    for entry in stale_shm_cleanup._SHM_DIR.iterdir():
        if stale_shm_cleanup._creator_pid(entry.name) != os.getpid():
            continue
        try:
            segment = shared_memory.SharedMemory(name=entry.name)
            segment.close()
            segment.unlink()  # also forgets it in the resource tracker, which would unlink it again
            unlinked += 1
        except (OSError, ValueError):
            pass  # gone meanwhile, or not a segment we can open
    return unlinked


def leave_now() -> None:
    """Unlink this process's shared memory, flush what it has logged, then exit without the
    native teardown."""
    try:
        try:
            unlink_own_shared_memory()
        except Exception:  # noqa: BLE001 - best effort: leaving is what matters
            pass
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    finally:
        os._exit(ENDED_AFTER_ERROR_CODE)


def arm(keep: Any = None) -> None:
    """Keep ``keep`` alive and make ``leave_now`` run first at exit: before the interpreter joins
    the threads still running where Python offers that hook, and as the last registered exit
    handler (atexit runs the last registered first) otherwise. Idempotent."""
    global _armed
    if keep is not None:
        _kept.append(keep)
    if not _armed:
        _armed = True
        atexit.register(leave_now)
        before_thread_join = getattr(threading, "_register_atexit", None)
        if before_thread_join is not None:
            before_thread_join(leave_now)


def around_run_event_loop(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``Scheduler.run_event_loop``: arm the quick exit when the loop raises."""
    try:
        return original(scheduler, *args, **kwargs)
    except Exception:  # what SGLang's process function logs and reports; a SystemExit keeps its code
        arm(scheduler)
        raise
