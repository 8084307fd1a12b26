"""The launcher's account of a failed pipeline: which rank died, how, and a fast exit on CPU.

When a scheduler process fails, SGLang's launcher learns it from a SIGQUIT (sent by the
failing scheduler, by a surviving rank whose pipeline wait failed, or by SGLang's
SubprocessWatchdog after a child died) and logs only "SIGQUIT received ... It usually means
one child failed". This module adds one line per rank that is not running normally any more::

    sglang-vpp: pipeline rank failed: pp_rank=1 tp_rank=0 node=0 pid=4242 killed by signal 9 (SIGKILL)
    sglang-vpp: pipeline rank failed: pp_rank=1 tp_rank=0 node=0 pid=4242 is stopped (SIGSTOP or a debugger) ...
    sglang-vpp: pipeline rank ended: pp_rank=0 tp_rank=0 node=0 pid=4241 exited with code 0 after the error it logged above

Data flow (launcher process)::

    SubprocessWatchdog.start(self)            [BEFORE hook: remember_ranks]
        -> the scheduler processes (self._processes) and their SGLang process titles
           ("sglang::scheduler_PP1_TP0") -> RankRecord(pp_rank, tp_rank, node, pid)
    SignalHandler.running_phase_sigquit_handler   [AROUND hook: around_sigquit_handler]
        -> report_failed_ranks: each remembered rank's exit status (os.waitid with WNOWAIT: the
           status stays for SGLang to collect) or state (stopped) -> one logger.error line each
        -> pending requests end with HTTP 503 / a last stream event naming the failed rank
           (SGLang's abort path, run on the server's event loop)
        -> after PENDING_GRACE_S SGLang's handler kills the whole tree (SIGKILL also ends a
           stopped process)

``use_cpu_crash_defaults`` (called while parsing, in the launcher): on ``--device cpu``
SGLang's crash handler would still sleep 5 s "to let GPU activity settle", run py-spy and wait
60 s for CUDA core dumps before it kills the tree; the two switches default to off there
(an explicit environment setting wins).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from sglang_vpp.sglang_plugin.rank_exit import ENDED_AFTER_ERROR_CODE

__all__ = [
    "SIGQUIT_HANDLER_TARGET",
    "WATCHDOG_START_TARGET",
    "PENDING_GRACE_S",
    "RankRecord",
    "around_sigquit_handler",
    "describe_exit",
    "parse_scheduler_title",
    "remember_ranks",
    "report_failed_ranks",
    "use_cpu_crash_defaults",
]

logger = logging.getLogger(__name__)

WATCHDOG_START_TARGET = "sglang.srt.utils.watchdog.SubprocessWatchdog.start"
SIGQUIT_HANDLER_TARGET = "sglang.srt.managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler"

_CPU_CRASH_DEFAULTS = {"SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "false", "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "false"}
_TITLE = re.compile(r"sglang::scheduler(?P<tags>\S*)")


@dataclass(frozen=True, slots=True)
class RankRecord:
    """One scheduler process of this launcher."""

    pp_rank: int
    """Pipeline rank (0 when the title has no PP tag, i.e. --pp-size 1)."""
    tp_rank: int
    """Tensor-parallel rank (0 when the title has no TP tag)."""
    node: int
    """``--node-rank`` of the launcher that started the process."""
    pid: int
    process: Any = None
    """The ``multiprocessing.Process``, whose exitcode survives SGLang reaping the child."""

    def label(self) -> str:
        return f"pp_rank={self.pp_rank} tp_rank={self.tp_rank} node={self.node} pid={self.pid}"


_ranks: list[RankRecord] = []
_stopping = False

PENDING_GRACE_S = 1.0
"""How long pending clients get to receive their error before SGLang kills the tree."""


def parse_scheduler_title(title: str) -> tuple[int, int] | None:
    """(pp_rank, tp_rank) from SGLang's scheduler process title, None for other processes."""
    match = _TITLE.search(title)
    if match is None:
        return None
    tags = dict(re.findall(r"_([A-Z_]*?[A-Z]+)(\d+)", match.group("tags")))
    return int(tags.get("PP", 0)), int(tags.get("TP", 0))


def describe_exit(code: int | None = None, sig: int | None = None) -> str:
    """'killed by signal 9 (SIGKILL)' / 'exited with code 1'."""
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {sig} ({name})"
    return f"exited with code {code}"


def _node_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().node_rank)
    except Exception:  # noqa: BLE001 - the node is informative only
        return 0


def remember_ranks(watchdog: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``SubprocessWatchdog.start``: record the scheduler processes it watches."""
    import psutil

    node = _node_rank()
    for process in getattr(watchdog, "_processes", []):
        pid = getattr(process, "pid", None)
        if pid is None or any(rank.pid == pid for rank in _ranks):
            continue
        try:
            parsed = parse_scheduler_title(" ".join(psutil.Process(pid).cmdline()))
        except (psutil.Error, OSError):
            parsed = None
        if parsed is not None:
            _ranks.append(RankRecord(parsed[0], parsed[1], node, pid, process))
    return None


def _failure_of(rank: RankRecord) -> str | None:
    """How ``rank`` failed, or None while it runs normally."""
    try:
        # WNOWAIT: look at a dead child's status without collecting it.
        info = os.waitid(os.P_PID, rank.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        info = None  # already collected (SGLang's watchdog polls): its Process has the code
        exitcode = getattr(rank.process, "exitcode", None)
        if exitcode is not None:
            return describe_exit(sig=-exitcode) if exitcode < 0 else describe_exit(code=exitcode)
    if info is not None:
        if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return describe_exit(sig=info.si_status)
        return describe_exit(code=info.si_status)
    import psutil

    try:
        status = psutil.Process(rank.pid).status()
    except psutil.NoSuchProcess:
        return "is gone (exit status unknown)"
    if status == psutil.STATUS_STOPPED:
        return "is stopped (SIGSTOP or a debugger) and no longer answers its peers"
    return None


_ENDED_ON_ITS_OWN = describe_exit(code=ENDED_AFTER_ERROR_CODE)
"""A scheduler that catches an error (its own, or a peer's death seen as a failed send or
receive) logs it, asks the launcher to stop the server and exits with this code (rank_exit)."""


FAILURE_SETTLE_S = 2.0
"""How long to look for the failed rank when a survivor reported first: a killed process closes
its sockets (which the survivor sees as a dead peer) a moment before its exit status exists."""


def _failed_ranks(settle_s: float) -> list[tuple[RankRecord, str]]:
    """The ranks not running normally, once one has failed or ``settle_s`` has passed (a rank
    that only ended itself does not end the wait: the one whose death it saw may show next)."""
    deadline = time.monotonic() + settle_s
    while True:
        failed = [(rank, _failure_of(rank)) for rank in _ranks]
        failed = [(rank, how) for rank, how in failed if how is not None]
        if any(how != _ENDED_ON_ITS_OWN for _, how in failed) or not _ranks or time.monotonic() >= deadline:
            return failed
        time.sleep(0.05)


def report_failed_ranks(settle_s: float = FAILURE_SETTLE_S) -> list[str]:
    """One log line per rank that is not running normally; returns the descriptions of those
    that failed (killed, stopped, an error exit code), or, when none did, of those that ended
    themselves, each saying it is not the failure (pending clients read them).

    A rank that ended itself (exit code 0) is not the failure: it stopped after an error it
    logged. When no rank of this launcher failed otherwise, the first failure was a peer's,
    possibly on another node (``--nnodes``), whose launcher reports its own ranks."""
    found = _failed_ranks(settle_s)
    failed = [(rank, how) for rank, how in found if how != _ENDED_ON_ITS_OWN]
    ended = [(rank, how) for rank, how in found if how == _ENDED_ON_ITS_OWN]
    for rank, how in failed:
        logger.error("sglang-vpp: pipeline rank failed: %s %s", rank.label(), how)
    for rank, how in ended:
        logger.error("sglang-vpp: pipeline rank ended: %s %s after the error it logged above", rank.label(), how)
    if ended and not failed:
        logger.error(
            "sglang-vpp: no pipeline rank of this launcher was killed, stopped or exited with an "
            "error code: the first failure is the one the error above names (a peer that is "
            "gone, or the rank's own); a rank on another node (--nnodes) is reported in that "
            "node's log"
        )
    if _ranks and not found:
        logger.error(
            "sglang-vpp: a scheduler reported a failure; every pipeline rank process is still "
            "running (%s): see that rank's error above",
            ", ".join(rank.label() for rank in _ranks),
        )
    if failed:
        return [f"{rank.label()} {how}" for rank, how in failed]
    return [f"{rank.label()} {how} after the error it logged: the failure is the peer it names, maybe on "
            "another node" for rank, how in ended]


def _fail_pending_requests(manager: Any, message: str) -> None:
    """On the server's event loop: end every pending request with status 503 and ``message``
    (SGLang's own abort path: a non-streamed request gets the status, a streamed one a last
    event whose finish_reason carries the message)."""
    from sglang.srt.managers.io_struct import AbortReq

    for rid in list(manager.rid_to_state):
        try:
            manager._handle_abort_req(
                AbortReq(rid=rid, finished_reason={"type": "abort", "message": message, "status_code": 503})
            )
        except Exception:  # noqa: BLE001 - best effort: the tree is killed next anyway
            logger.exception("sglang-vpp: could not fail pending request %s", rid)


def around_sigquit_handler(original: Any, handler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on SGLang's running-phase SIGQUIT handler (it kills the process tree).

    Logs the failed ranks, answers pending clients, then lets SGLang kill the tree after
    ``PENDING_GRACE_S`` (from a timer thread: the event loop must run to send the answers).
    """
    global _stopping
    if _stopping:
        return None  # a second SIGQUIT (watchdog and survivor both noticed): one report, one kill
    _stopping = True
    failed = report_failed_ranks()
    manager = getattr(handler, "tokenizer_manager", None)
    loop = getattr(manager, "event_loop", None)
    if loop is None or not loop.is_running() or not getattr(manager, "rid_to_state", None):
        return original(handler, *args, **kwargs)
    what = "; ".join(failed) if failed else "a pipeline rank failed"
    message = f"the server is stopping because a pipeline rank failed ({what}); see the server log"
    loop.call_soon_threadsafe(_fail_pending_requests, manager, message)
    timer = threading.Timer(PENDING_GRACE_S, original, args=(handler, *args), kwargs=kwargs)
    timer.daemon = True
    timer.start()
    return None


def use_cpu_crash_defaults(device: str | None) -> None:
    """On a CPU server, skip SGLang's GPU crash diagnostics (see the module docstring)."""
    if device == "cpu":
        for name, value in _CPU_CRASH_DEFAULTS.items():
            os.environ.setdefault(name, value)
