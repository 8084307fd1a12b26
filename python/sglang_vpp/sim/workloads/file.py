"""``file``: the requests of a workload file (format: ``sglang_vpp.workload_file``).

The same file drives ``bench-serve --workload file``, so a simulated load can be served as is.
The simulator models prefill, so a record's ``output_len`` is not used here.
"""

from __future__ import annotations

from pathlib import Path

from ...schedule import RequestSpec
from ...workload_file import WorkloadFileError, read_workload_file
from ..errors import WorkloadError
from .base import Workload

__all__ = ["file_workload", "read_requests"]


def read_requests(path: str | Path) -> list[RequestSpec]:
    try:
        records = read_workload_file(path)
    except WorkloadFileError as error:
        raise WorkloadError(str(error)) from None
    return [RequestSpec(r.length, r.arrival) for r in records]


def file_workload(path: str | Path, concurrency: int | None = None) -> Workload:
    return Workload("file", tuple(read_requests(path)), concurrency, f"requests from {path}")
