"""The workload file read by both ``simulate --workload file`` and ``bench-serve --workload file``.

One format, so a load can be simulated at paper scale and then served with the same requests.
JSONL, one request per line::

    {"length": 4096, "arrival": 0.5, "output_len": 16}

- ``length``: prompt tokens, an integer in 1..2**24 (``input_len`` or ``prompt_len`` are read too);
- ``arrival``: seconds after the start of the run, 0..MAX_ARRIVAL_S (a year; default 0: all at once);
- ``output_len``: tokens to generate, 1..2**24 (optional; bench-serve uses ``--output-len`` without
  it, and the simulator, which models prefill, ignores it).

Blank lines and lines starting with ``#`` are skipped; other keys are ignored (a file may carry
its own ids or notes). Requests are returned in arrival order (ties keep file order).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import json_text

__all__ = ["LENGTH_KEYS", "MAX_ARRIVAL_S", "MAX_TOKENS", "WorkloadFileError", "WorkloadRecord", "read_workload_file"]

LENGTH_KEYS = ("length", "input_len", "prompt_len")
#: Far beyond any served context (2**24 = 16M tokens); a larger count is a typo that would have
#: the simulator or a load generator work without end.
MAX_TOKENS = 1 << 24
#: A year of seconds: far beyond any replayed trace; a later arrival is a typo whose sums of
#: idle seconds overflow a float.
MAX_ARRIVAL_S = 365 * 24 * 3600.0
_EXAMPLE = '{"length": 4096, "arrival": 0.5, "output_len": 16}'


class WorkloadFileError(ValueError):
    """A workload file that cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class WorkloadRecord:
    """One request of a workload file."""

    length: int
    arrival: float = 0.0
    output_len: int | None = None


def _count(value: Any, key: str) -> int:
    # Booleans are ints in Python and 3.5 tokens is not a length: both are typos, not requests.
    whole = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ValueError(f"{key} must be a whole number of tokens, got {value!r}")
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"{key} must be in 1..{MAX_TOKENS}, got {value!r}")
    return int(value)


def _record(fields: Any) -> WorkloadRecord:
    if not isinstance(fields, dict):
        raise ValueError(f"expected a JSON object, got {type(fields).__name__}")
    keys = [k for k in LENGTH_KEYS if k in fields]
    if not keys:
        raise ValueError(f"no length; expected one of {', '.join(LENGTH_KEYS)}")
    if len(keys) > 1:  # one would be read and the other silently ignored
        raise ValueError(f"{' and '.join(keys)} both give the length; keep one")
    key = keys[0]
    arrival = fields.get("arrival", 0.0)
    if (isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival)
            or not 0 <= arrival <= MAX_ARRIVAL_S):
        raise ValueError(f"arrival must be a number of seconds in 0..{MAX_ARRIVAL_S:.0f}, got {arrival!r}")
    output_len = fields.get("output_len")
    return WorkloadRecord(_count(fields[key], key), float(arrival),
                          None if output_len is None else _count(output_len, "output_len"))


def read_workload_file(path: str | Path) -> list[WorkloadRecord]:
    """Every request of ``path`` in arrival order; ``WorkloadFileError`` on the first bad line."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise WorkloadFileError(f"workload file {str(path)!r} {what}; give a JSONL file, one request per line, "
                                f"like {_EXAMPLE}")
    try:
        # JSON text is UTF-8 (a leading BOM, as some editors write, is not part of it). Lines end
        # at "\n", "\r\n" or "\r" only: str.splitlines() would also cut at U+2028, U+2029 or
        # U+0085, which JSON allows unescaped inside a string such as a note.
        text = path.read_text(encoding="utf-8-sig")
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise WorkloadFileError(f"workload file {str(path)!r} cannot be read: {error}") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            records.append(_record(json_text.loads(line)))
        except (json.JSONDecodeError, ValueError) as error:
            raise WorkloadFileError(f"{path}:{number}: {error} in {line.strip()[:80]!r}; expected a line like "
                                    f"{_EXAMPLE}") from None
    if not records:
        raise WorkloadFileError(f"workload file {str(path)!r} holds no requests")
    return sorted(records, key=lambda r: r.arrival)
