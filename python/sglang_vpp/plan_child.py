"""The ``auto`` planner process: ``python -m sglang_vpp.plan_child PARENT_PID NICENESS``.

``plan_process.ProcessPlanner`` starts it, with its stdin and stdout as the pipes that carry
``plan_wire`` frames and its stderr the parent's. It loads the sizer the parent sends, which
imports the schedule core it is made of and nothing else (no sglang, no torch), then answers
each request in order until the parent closes its stdin. Before anything else it arranges to
die with its parent and lowers its priority (``plan_process``'s docstring says why here).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from typing import Any, BinaryIO, Callable

from sglang_vpp import plan_wire
from sglang_vpp.parent_death import die_with_parent

__all__ = ["main"]


def _plan(sizer: Any, lengths: tuple[int, ...]) -> Any:
    return sizer.choose(lengths)


def _modules(sizer: Any, _: object) -> tuple[tuple[str, ...], str]:
    import sglang_vpp

    return tuple(sorted(sys.modules)), str(sglang_vpp.__file__)


_HANDLERS: dict[str, Callable[[Any, Any], Any]] = {plan_wire.PLAN: _plan, plan_wire.MODULES: _modules}


def _answer(sizer: Any, kind: str, payload: Any) -> bytes:
    """The pickled answer: the result, or the error it raised (its traceback as text)."""
    try:
        return pickle.dumps((plan_wire.OK, _HANDLERS[kind](sizer, payload), ""), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # the plan's own error (or a result that does not pickle), raised where the parent waits
        text = traceback.format_exc()
        try:
            sent = pickle.dumps((plan_wire.ERROR, error, text), protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(sent)  # an exception whose constructor takes other arguments pickles but does not load
            return sent
        except Exception:
            stand_in = RuntimeError(f"{type(error).__name__}: {error}")
            return pickle.dumps((plan_wire.ERROR, stand_in, text), protocol=pickle.HIGHEST_PROTOCOL)


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Load the sizer, then answer requests until ``requests`` ends."""
    sizer = pickle.loads(plan_wire.read_frame(requests))
    plan_wire.send(answers, plan_wire.READY)
    while True:
        try:
            kind, payload = plan_wire.receive(requests)
        except EOFError:  # the parent closed our stdin: nothing more to plan
            return
        plan_wire.write_frame(answers, _answer(sizer, kind, payload))


def main(argv: list[str] | None = None) -> int:
    parent_pid, niceness = [int(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the line above: this process was adopted
        return 1
    os.nice(niceness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the process group; the parent decides
    # The answers get their own descriptor; fd 1 becomes stderr, so a stray print of an imported
    # module lands in the log, not inside a frame.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    try:
        serve(sys.stdin.buffer, answers)
    except (EOFError, BrokenPipeError):  # the parent went away mid-exchange
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
