"""Device-only tests reuse the comm test helpers (backend reasons, launcher wrapper)."""

from __future__ import annotations

import sys
from pathlib import Path

for _path in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "comm"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
