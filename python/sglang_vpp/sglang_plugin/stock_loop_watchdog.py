"""``--vpp-comm-timeout`` for the stock pipeline (cpp, dcpp): notice a stuck peer, end fast.

SGLang's own PP loop waits for its peers without a deadline of ours: a stopped (SIGSTOP) or
hung rank leaves the others blocked until SGLang's watchdog fires minutes later. The stock loop
calls ``Scheduler.ingest_requests`` once per micro-batch on every rank, idle or busy, and every
such step exchanges messages with the neighbouring ranks; a rank whose loop has not come back to
it for longer than the comm timeout is therefore waiting on a peer that does not answer (or is
running one forward longer than the timeout, which the timeout is meant to cover).

The watchdog only observes: it never touches the loop's data or order, so stock results are
unchanged. On expiry it logs one line naming this rank and sends SIGQUIT to the launcher, the
same signal a scheduler that hit an exception sends; the launcher then names the failed rank
(``failure_report``) and kills the process tree.

Data flow (each stock-mode scheduler process)::

    Scheduler.ingest_requests(self)      [BEFORE hook: StockLoopWatchdog.beat]
        -> last beat time; the first beat starts the checking thread
    thread: every min(1 s, timeout / 4): now - last beat > timeout -> log + SIGQUIT the launcher
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INGEST_TARGET", "StockLoopWatchdog", "install_stock_loop_watchdog"]

logger = logging.getLogger(__name__)

INGEST_TARGET = "sglang.srt.managers.scheduler.Scheduler.ingest_requests"


@dataclass
class StockLoopWatchdog:
    """Deadline on the stock loop's progress; fires at most once."""

    timeout_s: float
    """``--vpp-comm-timeout``."""
    describe_rank: Any = None
    """Callable returning 'pp_rank=.. tp_rank=..' for the log line (set at the first beat)."""
    _last_beat: float | None = None
    _fired: bool = False
    _thread: threading.Thread | None = field(default=None, repr=False)

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

    def _watch(self) -> None:
        interval = max(0.05, min(1.0, self.timeout_s / 4))
        while not self._fired:
            time.sleep(interval)
            stalled = self.stalled_for(time.monotonic())
            if stalled > self.timeout_s:
                self._fire(stalled)

    def _fire(self, stalled: float) -> None:
        self._fired = True
        rank = self.describe_rank() if self.describe_rank else f"pid={os.getpid()}"
        logger.error(
            "sglang-vpp: stock pipeline rank %s pid=%d waited %.1f s for its peers, longer than "
            "--vpp-comm-timeout %.1f s: a peer rank is stuck or dead; stopping the server",
            rank, os.getpid(), stalled, self.timeout_s,
        )  # fmt: skip
        try:
            os.kill(os.getppid(), signal.SIGQUIT)  # the launcher kills the tree on SIGQUIT
        except OSError:
            pass


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
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    watchdog = StockLoopWatchdog(timeout_s=float(timeout_s))
    HookRegistry.register(INGEST_TARGET, watchdog.beat, HookType.BEFORE)
    return watchdog
