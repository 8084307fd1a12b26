"""``file``: requests from a JSONL file, one object per line.

Each line: ``{"length": <tokens>, "arrival": <seconds, optional, default 0>}``; ``input_len`` or
``prompt_len`` are accepted for ``length``. Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...schedule import RequestSpec
from ..errors import WorkloadError
from .base import Workload

__all__ = ["file_workload", "read_requests"]

_LENGTH_KEYS = ("length", "input_len", "prompt_len")


def read_requests(path: str | Path) -> list[RequestSpec]:
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"workload file {str(path)!r} does not exist; pass --file with a JSONL path")
    requests = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
            key = next(k for k in _LENGTH_KEYS if k in record)
            requests.append(RequestSpec(int(record[key]), float(record.get("arrival", 0.0))))
        except StopIteration:
            raise WorkloadError(f"{path}:{number}: no length; expected one of {_LENGTH_KEYS}, got {line.strip()[:80]!r}") from None
        except (json.JSONDecodeError, TypeError, ValueError) as error:
            raise WorkloadError(f"{path}:{number}: cannot read {line.strip()[:80]!r}: {error}; expected "
                                '{"length": 4096, "arrival": 0.5}') from None
    if not requests:
        raise WorkloadError(f"workload file {str(path)!r} holds no requests")
    return sorted(requests, key=lambda r: r.arrival)


def file_workload(path: str | Path, concurrency: int | None = None) -> Workload:
    return Workload("file", tuple(read_requests(path)), concurrency, f"requests from {path}")
