"""``auto`` plans off the loop that asks for them: in a child process, or on a worker thread.

A plan is pure Python and takes 0.3-2 s at P = 4/8 on a 32-61 layer model (docs/auto-chunk.md,
"Server"). On a thread of the scheduler process it holds the interpreter lock against rank 0's
loop, which feeds every pipeline rank, so ``ProcessPlanner`` plans in a child process instead:
the sizer (``AutoSizer``: policy, layout, cost estimate, candidates and the answers it holds)
goes to the child once, then each situation's prompt lengths; the ``AutoChoice`` comes back and
the caller applies it as it would its own (``Controller.adopt_size``). A plan is a pure function
of the situation, so the child's answer is the one the loop would have computed.

The child is a fresh interpreter, ``python -m sglang_vpp.plan_child``, that speaks
length-prefixed pickles over its stdin and stdout (``plan_wire``). Not ``multiprocessing``: a
forked copy of the scheduler process (torch, gloo, communication threads) may inherit a lock
some thread held, and ``spawn`` re-imports the parent's ``__main__`` in the child, which on a
server is SGLang's launcher module (seconds and hundreds of MB, for nothing the plan uses).
The child imports ``plan_child`` and what the sizer's pickle names, the schedule core; it finds
``sglang_vpp`` where the parent did (the parent's ``sys.path`` as its ``PYTHONPATH``), and its
stderr is the parent's, so a crash is in the server log. A sizer made of something defined in
``__main__`` would not load there: ``planner_for`` sees it when it pickles the sizer and plans on
a thread, as for a sizer that does not pickle at all (a chunker factory written as a closure; the
server's never is), and says why.

Its first act is to ask the kernel to kill it when its parent dies (``parent_death``; Popen
runs from the caller's thread, the one the kernel watches), then to check that its parent is
still the one that started it (a parent that died before that is no longer its parent), then to
lower its priority (``PLANNER_NICENESS``). The child does this, not a ``preexec_fn`` in the
parent: a ``preexec_fn`` makes Popen fork the whole scheduler process instead of using vfork,
which holds the caller longer the more memory the process maps (docs/sglang-vpp.md, measured),
and runs Python in a forked copy of a threaded process; the check closes the window before the
request as surely. The parent talks to the child from one thread, one request at a
time: the caller never waits on a pipe. A child that died (pipe closed) fails the answer with
``PlannerDiedError``; ``close`` kills it and reaps it, each wait bounded.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import types
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, Sequence

from sglang_vpp import plan_wire
from sglang_vpp.child_env import child_environment

__all__ = ["PLANNER_NICENESS", "AutoPlanner", "PlannerDiedError", "ProcessPlanner", "ThreadPlanner", "planner_for",
           "sizer_bytes"]

logger = logging.getLogger(__name__)

CHILD_MODULE = "sglang_vpp.plan_child"

PLANNER_NICENESS = 10
"""Added to the child's nice value: where the loop and the child share a CPU (no spare core), the
loop that feeds every rank runs first and the plan, whose size only applies later, waits."""

CLOSE_TIMEOUT_S = 10.0
"""The longest ``close`` waits for the killed child to be reaped, and then for the thread that
talked to it."""


class PlannerDiedError(RuntimeError):
    """The child process that plans ``auto`` situations is gone (killed, or out of memory)."""


class PlannerTraceback(Exception):
    """The child's traceback of a plan that raised, as the ``__cause__`` of the error re-raised here."""

    def __str__(self) -> str:
        return f"\n\nin the auto planner process:\n{self.args[0]}"


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


_MAIN_MODULES = frozenset({"__main__", "__mp_main__"})
"""The parent's main module by either name (``multiprocessing`` children, as SGLang's scheduler
processes are, load it as ``__mp_main__``); the child imports neither."""


class _NoMainPickler(pickle.Pickler):
    """Pickles as ``pickle`` does, refusing what names ``__main__``: the child's ``__main__`` is
    ``plan_child``, not the parent's."""

    def reducer_override(self, obj: Any) -> Any:
        named = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        if getattr(named, "__module__", None) in _MAIN_MODULES:
            raise pickle.PicklingError(f"{named.__qualname__} is defined in __main__, which the planner process "
                                       "does not import")
        return NotImplemented


def sizer_bytes(sizer: Any) -> bytes:
    """``sizer`` pickled for the planner process; ``pickle.PicklingError`` (or what ``pickle``
    raises) when it cannot be loaded there."""
    buffer = io.BytesIO()
    _NoMainPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(sizer)
    return buffer.getvalue()


class ProcessPlanner:
    """Plans with a copy of ``sizer`` in one child process (module docstring)."""

    def __init__(self, sizer_bytes: bytes, niceness: int = PLANNER_NICENESS) -> None:
        """``sizer_bytes``: the pickled ``AutoSizer`` (``planner_for`` makes it, ``sizer_bytes``);
        ``niceness``: added to the child's nice value (``PLANNER_NICENESS``)."""
        # Started here, from the calling (loop) thread, whose exit is the one PR_SET_PDEATHSIG watches.
        self._process = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, str(os.getpid()), str(niceness)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=child_environment())
        self._closed = False
        self._closing = threading.Lock()
        self._broken: BaseException | None = None
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self.started: Future = Future()
        """Done when the child has loaded the sizer (its error if it could not)."""
        self._requests.put((None, self.started, "loading its sizer"))
        self._talker = threading.Thread(target=self._talk, args=(sizer_bytes,), name="vpp-auto-plan-pipe",
                                        daemon=True)
        self._talker.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._process.pid

    def submit(self, lengths: Sequence[int]) -> Future:
        """The answer to come; a child that died makes it a ``PlannerDiedError``."""
        planned = tuple(int(length) for length in lengths)
        return self._ask(plan_wire.PLAN, planned, f"planning the chunk size for {len(planned)} prompts")

    def modules(self) -> Future:
        """The child's ``sys.modules`` names and its ``sglang_vpp.__file__`` (what it imported)."""
        return self._ask(plan_wire.MODULES, None, "listing its modules")

    def _ask(self, kind: str, payload: Any, doing: str) -> Future:
        answer: Future = Future()
        with self._closing:  # no request queued behind close's end mark, where none would answer it
            if self._closed:
                raise RuntimeError("the auto planner was closed; it plans nothing more")
            self._requests.put(((kind, payload), answer, doing))
        return answer

    def _talk(self, sizer: bytes) -> None:
        """The one thread that writes requests and reads answers, in order, until ``close``."""
        while (item := self._requests.get()) is not None:
            request, answer, doing = item
            if self._closed:
                answer.cancel()
                continue
            if not answer.set_running_or_notify_cancel():
                continue
            if self._broken is not None:
                answer.set_exception(self._died(doing, self._broken))
                continue
            try:
                if request is None:
                    plan_wire.write_frame(self._process.stdin, sizer)
                else:
                    plan_wire.send(self._process.stdin, request)
                frame = plan_wire.read_frame(self._process.stdout)
            except (OSError, EOFError, ValueError) as error:  # pipe closed: the child is gone (or closing)
                self._broken = error
                answer.set_exception(self._died(doing, error))
                continue
            try:
                reply = pickle.loads(frame)
            except Exception as error:  # an answer that does not unpickle here; the pipe is still in step
                answer.set_exception(error)
                continue
            if reply == plan_wire.READY:
                answer.set_result(self.pid)
            elif reply[0] == plan_wire.OK:
                answer.set_result(reply[1])
            else:
                _, error, text = reply
                error.__cause__ = PlannerTraceback(text)
                answer.set_exception(error)  # the plan itself raised: the caller sees its error

    def _died(self, doing: str, error: BaseException) -> PlannerDiedError:
        code = self._process.poll()
        how = f", exit status {code}" if code is not None else ""
        return PlannerDiedError(
            f"the auto planner process (pid {self.pid}) died while {doing} ({type(error).__name__}: {error}{how}); "
            "it was killed, ran out of memory, or failed to start (its traceback, if any, is in the server log). "
            "The server cannot size chunks without it: check the system log for an out-of-memory kill and restart "
            "the server."
        )

    def close(self) -> None:
        """End the child, a plan running or not (its answer would be dropped anyway), reap it,
        and stop the thread that talked to it."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._requests.put(None)
        try:
            self._process.kill()  # our unreaped child: the pid cannot name another process
        except ProcessLookupError:
            pass
        try:
            self._process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the auto planner process (pid %d) did not end within %.0f s of SIGKILL", self.pid,
                           CLOSE_TIMEOUT_S)
        self._talker.join(timeout=CLOSE_TIMEOUT_S)
        if self._talker.is_alive():  # still in a pipe call: closing the pipe under it would wait too
            logger.warning("the auto planner's pipe thread did not stop within %.0f s", CLOSE_TIMEOUT_S)
            return
        for pipe in (self._process.stdin, self._process.stdout):
            try:
                pipe.close()
            except OSError:  # a request unsent to the killed child
                pass


def planner_for(controller: Any) -> AutoPlanner:
    """A ``ProcessPlanner`` for ``controller``'s ``auto`` sizer, or a ``ThreadPlanner`` (logged,
    with the reason) when the sizer cannot go to a planner process or processes cannot be started here."""
    try:
        return ProcessPlanner(sizer_bytes(controller.chunker.sizer))
    except (pickle.PicklingError, AttributeError, TypeError, ValueError, OSError, subprocess.SubprocessError) as error:
        logger.warning("auto chunk size: planning on a worker thread, which shares the interpreter lock with "
                       "the scheduler loop, because a planner process cannot be used here: %s", error)
        return ThreadPlanner(controller)
