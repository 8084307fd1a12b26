"""``auto`` plans off the loop that asks for them: in a child process, or on a worker thread.

A plan is pure Python and takes 0.3-2 s at P = 4/8 on a 32-61 layer model (docs/auto-chunk.md,
"Server"). On a thread of the scheduler process it holds the interpreter lock against rank 0's
loop, which feeds every pipeline rank, so ``ProcessPlanner`` plans in a child process instead:
the sizer (``AutoSizer``: policy, layout, cost estimate, candidates and the answers it holds)
goes to the child once, then each situation's prompt lengths; the ``AutoChoice`` comes back and
the caller applies it as it would its own (``Controller.adopt_size``). A plan is a pure function
of the situation, so the child's answer is the one the loop would have computed.

The child is started with ``spawn``: the scheduler process runs torch, gloo and communication
threads, and a forked copy of a threaded process may inherit a lock some thread held. It imports
this module and the schedule core (and, as ``spawn`` does, the parent's ``__main__``: on a server
SGLang's launcher module, once, when the child starts). It dies with its parent
(``parent_death``); ``close`` ends it. ``planner_for`` falls back to ``ThreadPlanner`` where the
sizer does not pickle (a chunker factory a caller wrote as a closure), and says so.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol, Sequence

from sglang_vpp.parent_death import die_with_parent
from sglang_vpp.schedule.auto_size import AutoChoice, AutoSizer

__all__ = ["PLANNER_NICENESS", "AutoPlanner", "PlannerDiedError", "ProcessPlanner", "ThreadPlanner", "planner_for"]

logger = logging.getLogger(__name__)

START_METHOD = "spawn"

PLANNER_NICENESS = 10
"""Added to the child's nice value: where the loop and the child share a CPU (no spare core), the
loop that feeds every rank runs first and the plan, whose size only applies later, waits."""


class PlannerDiedError(RuntimeError):
    """The child process that plans ``auto`` situations is gone (killed, or out of memory)."""


class AutoPlanner(Protocol):
    def submit(self, lengths: Sequence[int]) -> Future:
        """The ``AutoChoice`` for ``lengths``, to come."""

    def close(self) -> None:
        """Stop planning; nothing is left running."""


class ThreadPlanner:
    """Plans with ``controller.auto_plan`` on one worker thread (shares the interpreter lock)."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vpp-auto-plan")

    def submit(self, lengths: Sequence[int]) -> Future:
        return self._worker.submit(self.controller.auto_plan, tuple(lengths))

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


_CHILD_SIZER: AutoSizer | None = None
"""The child's sizer, from ``_start_child``."""


def _start_child(sizer_bytes: bytes, niceness: int, parent_pid: int) -> None:
    global _CHILD_SIZER
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died while spawn imported its __main__, before the line above
        os._exit(1)
    os.nice(niceness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the process group; the parent decides
    _CHILD_SIZER = pickle.loads(sizer_bytes)


def _plan_in_child(lengths: tuple[int, ...]) -> AutoChoice:
    assert _CHILD_SIZER is not None, "the planner child was started without its sizer"
    return _CHILD_SIZER.choose(lengths)


class ProcessPlanner:
    """Plans with a copy of ``sizer`` in one child process (module docstring)."""

    def __init__(self, sizer_bytes: bytes, niceness: int = PLANNER_NICENESS) -> None:
        """``sizer_bytes``: the pickled ``AutoSizer`` (``planner_for`` checks that it pickles);
        ``niceness``: added to the child's nice value (``PLANNER_NICENESS``)."""
        context = multiprocessing.get_context(START_METHOD)
        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_start_child,
                                         initargs=(sizer_bytes, niceness, os.getpid()))
        # Starts the child now, from the calling (loop) thread, whose exit is the one
        # PR_SET_PDEATHSIG watches; the pid names the child in errors and lets close end it.
        self._pid: Future = self._pool.submit(os.getpid)
        self._closed = False

    @property
    def pid(self) -> int | None:
        """The child's process id, once it has started."""
        if not self._pid.done() or self._pid.cancelled() or self._pid.exception() is not None:
            return None
        return int(self._pid.result())

    def submit(self, lengths: Sequence[int]) -> Future:
        """The answer to come; a child that died makes it a ``PlannerDiedError``."""
        answer: Future = Future()
        planned = tuple(int(length) for length in lengths)
        try:
            inner = self._pool.submit(_plan_in_child, planned)
        except BrokenProcessPool as error:
            answer.set_exception(self._died(planned, error))
            return answer

        def relay(done: Future) -> None:
            if done.cancelled():
                answer.cancel()
                return
            error = done.exception()
            if isinstance(error, BrokenProcessPool):
                answer.set_exception(self._died(planned, error))
            elif error is not None:
                answer.set_exception(error)  # the plan itself raised: the caller sees its error
            else:
                answer.set_result(done.result())

        inner.add_done_callback(relay)
        return answer

    def _died(self, lengths: tuple[int, ...], error: BaseException) -> PlannerDiedError:
        pid = self.pid
        who = f"the auto planner process (pid {pid})" if pid is not None else "the auto planner process"
        return PlannerDiedError(
            f"{who} died while planning the chunk size for {len(lengths)} prompts ({error}); it was killed, "
            "ran out of memory, or failed to start (its traceback, if any, is in the server log). The server "
            "cannot size chunks without it: check the system log for an out-of-memory kill and restart the server."
        )

    def close(self) -> None:
        """End the child, a plan running or not (its answer would be dropped anyway), and wait
        for the pool to reap it."""
        if self._closed:
            return
        self._closed = True
        # The pool's own record of its child, known from the first submit on: the pid the child
        # reports comes only once it has started (importing the parent's __main__ first), and
        # shutdown would wait for that start.
        for process in list((getattr(self._pool, "_processes", None) or {}).values()):
            try:
                process.kill()  # our unreaped child: the pid cannot name another process
            except (ProcessLookupError, ValueError):  # gone already, or closed
                pass
        self._pool.shutdown(wait=True, cancel_futures=True)


def planner_for(controller: Any) -> AutoPlanner:
    """A ``ProcessPlanner`` for ``controller``'s ``auto`` sizer, or a ``ThreadPlanner`` (logged,
    with the reason) when the sizer does not pickle or processes cannot be started here."""
    sizer = controller.chunker.sizer
    try:
        sizer_bytes = pickle.dumps(sizer)
        return ProcessPlanner(sizer_bytes)
    except (pickle.PicklingError, AttributeError, TypeError, ValueError, OSError) as error:
        logger.warning("auto chunk size: planning on a worker thread, which shares the interpreter lock with "
                       "the scheduler loop, because a planner process cannot be used here: %s", error)
        return ThreadPlanner(controller)
