"""``--vpp-comm-timeout`` for the stock pipeline (cpp, dcpp): notice a stuck peer, end fast.

SGLang's own PP loop waits for its peers without a deadline of ours: a stopped (SIGSTOP) or
hung rank leaves the others blocked until SGLang's watchdog fires minutes later. The stock loop
calls ``Scheduler.ingest_requests`` once per micro-batch on every rank, idle or busy, and every
such step exchanges messages with the neighbouring ranks; a rank whose loop has not come back to
it for longer than the comm timeout is waiting on a peer. That peer may be stuck, or only slow
(a first forward under load): the watchdog then looks at the rank processes of this server
(siblings under the same launcher) and fires only if one is stopped, dead or gone, or if none
used CPU during the window (all wait on each other). Ranks on another node are not looked at.

The watchdog only observes: it never touches the loop's data or order, so stock results are
unchanged. On expiry it logs one line naming this rank and sends SIGQUIT to the launcher, the
same signal a scheduler that hit an exception sends; the launcher then names the failed rank
(``failure_report``) and kills the process tree.

Data flow (each stock-mode scheduler process)::

    Scheduler.ingest_requests(self)      [BEFORE hook: StockLoopWatchdog.beat]
        -> last beat time; the first beat starts the checking thread
    thread: every min(1 s, timeout / 4): sibling rank processes' state and CPU time;
            now - last beat > timeout + idle wait and (a rank stopped / dead / gone, or no rank used CPU)
            -> log + SIGQUIT the launcher
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INGEST_TARGET", "RankProcessState", "StockLoopWatchdog", "install_stock_loop_watchdog", "sibling_ranks"]

logger = logging.getLogger(__name__)

INGEST_TARGET = "sglang.srt.managers.scheduler.Scheduler.ingest_requests"
IDLE_SLEEP_POLL_S = 1.0
"""The longest wait of SGLang's idle sleep (``--sleep-on-idle``: ``IdleSleeper.maybe_sleep`` polls
its sockets for 1000 ms), counted on top of the comm timeout whether or not the flag is set: one
second later to notice a stuck peer, never a healthy idle server ended."""


@dataclass(frozen=True, slots=True)
class RankProcessState:
    """One scheduler process of this server, as seen from a sibling."""

    pid: int
    status: str
    """psutil status ('running', 'sleeping', 'stopped', 'zombie', ...) or 'gone'."""
    cpu_s: float
    """User + system CPU seconds so far (0 when gone)."""


def sibling_ranks() -> list[RankProcessState]:
    """Every scheduler process under this process's launcher (this one included)."""
    import psutil

    out = []
    for child in psutil.Process(os.getppid()).children():
        try:
            if "sglang::scheduler" not in " ".join(child.cmdline()):
                continue
            times = child.cpu_times()
            out.append(RankProcessState(child.pid, child.status(), times.user + times.system))
        except psutil.NoSuchProcess:
            out.append(RankProcessState(child.pid, "gone", 0.0))
        except psutil.Error:
            continue
    return out


@dataclass
class StockLoopWatchdog:
    """Deadline on the stock loop's progress; fires at most once.

    A loop that has not come round for ``timeout_s`` fires only when the ranks are not working:
    a rank process is stopped, dead or gone, or no rank process used CPU during the last
    ``timeout_s`` (everyone waits on everyone). A peer still computing (a long first forward, an
    overloaded machine) keeps its neighbours waiting without firing.
    """

    timeout_s: float
    """``--vpp-comm-timeout``."""
    describe_rank: Any = None
    """Callable returning 'pp_rank=.. tp_rank=..' for the log line (set at the first beat)."""
    ranks: Callable[[], list[RankProcessState]] = sibling_ranks
    """Snapshot of the server's rank processes (injected by tests)."""
    idle_cpu_fraction: float = 0.02
    """Below this share of the window in CPU seconds, summed over ranks, nobody is working."""
    idle_wait_s: float = 0.0
    """How long a healthy idle loop may wait between two beats on top of ``timeout_s``: under
    ``--sleep-on-idle`` SGLang's idle sleep polls its input sockets for up to a second per turn,
    using no CPU, which would otherwise read as a stuck pipeline under a timeout of about 1 s."""
    _last_beat: float | None = None
    _fired: bool = False
    _thread: threading.Thread | None = field(default=None, repr=False)
    _cpu_history: deque = field(default_factory=deque, repr=False)
    _known: set[int] = field(default_factory=set, repr=False)
    """Rank pids seen so far: one missing later has been reaped (it is gone)."""

    def beat(self, scheduler: Any = None, *args: Any, **kwargs: Any) -> None:
        """BEFORE hook on ``Scheduler.ingest_requests``: the loop came round once more."""
        self._last_beat = time.monotonic()
        if self._thread is None:
            self.describe_rank = self.describe_rank or _rank_describer(scheduler)
            self._thread = threading.Thread(target=self._watch, name="sglang-vpp-stock-loop-watchdog", daemon=True)
            self._thread.start()
        return None

    def stalled_for(self, now: float) -> float:
        return 0.0 if self._last_beat is None else now - self._last_beat

    def check(self, now: float) -> str | None:
        """Why the pipeline is stuck, or None; records this moment's CPU times."""
        states = self.ranks()
        seen = {state.pid for state in states}
        states += [RankProcessState(pid, "gone", 0.0) for pid in sorted(self._known - seen)]
        self._known |= seen
        self._cpu_history.append((now, sum(state.cpu_s for state in states)))
        while self._cpu_history and now - self._cpu_history[0][0] > self.timeout_s:
            self._cpu_history.popleft()
        if self.stalled_for(now) <= self.timeout_s + self.idle_wait_s:
            return None
        broken = [f"pid={state.pid} is {state.status}" for state in states if state.status in _NOT_WORKING]
        if broken:
            return "rank process " + ", ".join(broken)
        window_s = now - self._cpu_history[0][0]
        used_s = self._cpu_history[-1][1] - self._cpu_history[0][1]
        if window_s >= 0.75 * self.timeout_s and used_s < self.idle_cpu_fraction * window_s:
            return f"no rank process computed during the last {window_s:.1f} s (they all wait)"
        return None

    def _watch(self) -> None:
        interval = max(0.05, min(1.0, self.timeout_s / 4))
        while not self._fired:
            time.sleep(interval)
            now = time.monotonic()
            try:
                why = self.check(now)
            except Exception:  # noqa: BLE001 - the watchdog must never take the rank down itself
                logger.exception("sglang-vpp: stock loop watchdog check failed")
                continue
            if why is not None:
                self._fire(self.stalled_for(now), why)

    def _fire(self, stalled: float, why: str) -> None:
        self._fired = True
        rank = self.describe_rank() if self.describe_rank else f"pid={os.getpid()}"
        logger.error(
            "sglang-vpp: stock pipeline rank %s pid=%d waited %.1f s for its peers, longer than "
            "--vpp-comm-timeout %.1f s, and %s: stopping the server",
            rank, os.getpid(), stalled, self.timeout_s, why,
        )  # fmt: skip
        try:
            os.kill(os.getppid(), signal.SIGQUIT)  # the launcher kills the tree on SIGQUIT
        except OSError:
            pass


_NOT_WORKING = frozenset({"stopped", "zombie", "dead", "gone", "tracing-stop"})


def _rank_describer(scheduler: Any):
    def describe() -> str:
        try:
            from sglang.srt.runtime_context import get_parallel

            parallel = get_parallel()
            return f"pp_rank={parallel.pp_rank} tp_rank={parallel.tp_rank}"
        except Exception:  # noqa: BLE001 - informative only
            return "(rank unknown)"

    return describe


def install_stock_loop_watchdog(timeout_s: float) -> StockLoopWatchdog:
    """Register the BEFORE hook (this scheduler process); HookRegistry.apply_hooks() follows."""
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    watchdog = StockLoopWatchdog(timeout_s=float(timeout_s), idle_wait_s=IDLE_SLEEP_POLL_S)
    register_hook(INGEST_TARGET, watchdog.beat, HookType.BEFORE)
    return watchdog
