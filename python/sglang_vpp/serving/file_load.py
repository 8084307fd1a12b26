"""SGLang's ``bench_serving`` with the requests of a workload file (``sglang_vpp.workload_file``).

Run as ``python -m sglang_vpp.serving.file_load --workload-file F <bench_serving flags>``.

bench_serving has no dataset that takes an exact length and arrival time per request (its
``--use-trace-timestamps`` is not wired to the request pacing in SGLang 0.5.23, and the mooncake
trace builds prompts from hash blocks). So this process runs bench_serving's own command line
with two of its module functions replaced, for this process only (in the warm worker of
``serving/bench_worker.py``, for this pass only: the worker puts both back before the next):

- ``get_dataset``: one row per record, drawn at the record's length by bench_serving's own
  ``random-ids`` sampler (token ids, sent as ids, as ``--tokenize-prompt`` does), with the
  record's output length (else ``--random-output-len``);
- ``get_request``: with bench_serving's own ``--use-trace-timestamps``, each request leaves at its
  record's arrival, in seconds after the measured run starts (without it, all at once: a warm-up
  pass); ``--request-rate`` is never used.

Everything else (warm-up, ``--max-concurrency``, the streaming client, the metrics and the JSONL
``--output-file``) is bench_serving's, so the numbers compare one to one with its other datasets.
``check_targets`` finds both targets (``bench-serve`` calls it before starting any server, and
each pass again before it runs); a missing one is an error naming it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any

from ..workload_file import WorkloadFileError, WorkloadRecord, read_workload_file
from .bench_worker import BENCH_SERVING_MODULE as _BENCH_SERVING

__all__ = ["WORKLOAD_FILE_FLAG", "HookTargetMissing", "check_targets", "hook_bench_serving", "main"]

WORKLOAD_FILE_FLAG = "--workload-file"
_RANDOM_SAMPLER = "sglang.benchmark.datasets.random"


class HookTargetMissing(RuntimeError):
    """This SGLang's bench_serving lacks a function the file load replaces or calls."""


def check_targets() -> tuple[ModuleType, Any]:
    """bench_serving's module and its random-ids sampler; ``HookTargetMissing`` names what is absent."""
    import importlib

    bench = importlib.import_module(_BENCH_SERVING)
    sampler = getattr(importlib.import_module(_RANDOM_SAMPLER), "sample_random_requests", None)
    missing = [f"{_BENCH_SERVING}.{name}" for name in ("get_dataset", "get_request", "cli_main")
               if not callable(getattr(bench, name, None))]
    if sampler is None:
        missing.append(f"{_RANDOM_SAMPLER}.sample_random_requests")
    if not missing and not inspect.isasyncgenfunction(bench.get_request):
        missing.append(f"{_BENCH_SERVING}.get_request as an async generator")
    row_type = getattr(bench, "DatasetRow", None)
    if row_type is None or "timestamp" not in {f.name for f in dataclasses.fields(row_type)}:
        missing.append(f"{_BENCH_SERVING}.DatasetRow.timestamp")
    if missing:
        raise HookTargetMissing(f"this SGLang's bench_serving has no {', '.join(missing)}; --workload file "
                                "supports SGLang 0.5.23 (use a --workload preset or --dataset-name instead)")
    return bench, sampler


def _rows(records: Sequence[WorkloadRecord], sampler: Any, args: Any, tokenizer: Any) -> list[Any]:
    chosen = records[: args.num_prompts]
    # One draw per distinct length (each row its own random offset), so no row is built longer
    # than its record: a file may hold many short requests next to one very long one.
    drawn = {length: sampler(input_len=length, output_len=1, num_prompts=count, range_ratio=1.0,
                             tokenizer=tokenizer, dataset_path="", random_sample=False, return_text=False)
             for length, count in sorted(Counter(r.length for r in chosen).items())}
    return [
        dataclasses.replace(drawn[r.length].pop(), output_len=r.output_len or args.random_output_len,
                            timestamp=r.arrival * 1e3 if args.use_trace_timestamps else 0.0)
        for r in chosen
    ]  # fmt: skip


async def _at_arrivals(input_requests: Sequence[Any], request_rate: float, *_: Any, **__: Any) -> AsyncIterator[Any]:
    """Yield each row at its arrival (``timestamp``, ms after the first yield's call)."""
    start = time.perf_counter()
    for row in input_requests:
        delay = row.timestamp / 1e3 - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        yield row


def hook_bench_serving(records: Sequence[WorkloadRecord]) -> ModuleType:
    """bench_serving's module with the file's rows and arrivals in place of its dataset and pacing."""
    bench, sampler = check_targets()
    bench.get_dataset = lambda args, tokenizer, model_id=None: _rows(records, sampler, args, tokenizer)
    bench.get_request = _at_arrivals
    return bench


def _split_argv(argv: list[str]) -> tuple[str, list[str]]:
    if WORKLOAD_FILE_FLAG not in argv or argv.index(WORKLOAD_FILE_FLAG) + 1 >= len(argv):
        raise WorkloadFileError(f"{WORKLOAD_FILE_FLAG} FILE is required")
    at = argv.index(WORKLOAD_FILE_FLAG)
    return argv[at + 1], argv[:at] + argv[at + 2:]


def main(argv: list[str] | None = None) -> None:
    try:
        path, rest = _split_argv(list(sys.argv[1:] if argv is None else argv))
        bench = hook_bench_serving(read_workload_file(path))
    except (WorkloadFileError, HookTargetMissing) as error:
        sys.exit(f"error: {error}")
    sys.argv = [_BENCH_SERVING, *rest]
    bench.cli_main()


if __name__ == "__main__":
    main()
