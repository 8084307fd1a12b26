"""JSON text from files a user hands us (presets, workloads, cost profiles, traces, configs).

``json.loads`` raises ``RecursionError``, not ``JSONDecodeError``, on arrays or objects nested
thousands deep; every reader already turns ``JSONDecodeError`` into its own one-line error, so
``loads`` makes that case one more ``JSONDecodeError``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def loads(text: str | bytes) -> Any:
    """``json.loads``; a document nested too deep to parse is a ``json.JSONDecodeError``."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode(errors="replace")
        raise json.JSONDecodeError("nested too deep to read", doc, 0) from None
