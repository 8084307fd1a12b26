"""Turn SIGTERM and SIGHUP into ``SystemExit`` while servers this process started are up.

Python's default for both signals ends the process at once, without running ``finally``
blocks, so a ``bench-serve --launch`` stopped by ``timeout``, a job scheduler or a closed
terminal would leave its SGLang servers' processes behind (the launch server dies with its
parent, but SGLang's own children of it do not all follow). Raised as ``SystemExit`` instead,
the signal unwinds through the launcher's ``finally``, which stops every server's whole process
group (``SGLangServer.stop``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["STOP_SIGNALS", "stop_signals_as_exit"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # the shell's status for a process ended by that signal


@contextlib.contextmanager
def stop_signals_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)``; the previous
    handlers come back after it. Only the main thread can set handlers: elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _exit) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
