"""The environment of a child Python this package starts (the auto planner, the bench_serving worker).

The parent's environment with its module search path as ``PYTHONPATH``: the child imports the
``sglang_vpp`` the parent imported (a worktree on ``PYTHONPATH`` or ``sys.path`` included), not
whichever copy is installed.
"""

from __future__ import annotations

import os
import sys

__all__ = ["child_environment"]


def child_environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
