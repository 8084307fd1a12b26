"""Die with the parent process (Linux ``PR_SET_PDEATHSIG``), so a killed launcher leaves no
orphan ranks or servers. Elsewhere a no-op: callers that must notice an orphaned state poll
``os.getppid()`` as well.

``prctl`` is resolved when this module is imported, so ``die_with_parent`` is safe as a
``preexec_fn`` (between fork and exec the child only calls it).
"""

from __future__ import annotations

import ctypes
import signal
import sys
from typing import Callable

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
