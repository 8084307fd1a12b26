"""Workloads: which requests arrive when (``long``, ``short``, ``mixed``, ``file``)."""

from __future__ import annotations

from ..errors import WorkloadError
from .base import Workload, check_concurrency, check_workload_requests
from . import long, mixed, short
from .file import file_workload, read_requests
from .long import long_workload
from .mixed import describe_lengths, mixed_lengths, mixed_workload
from .short import short_workload

__all__ = ["Workload", "WORKLOADS", "build_workload", "long_workload", "short_workload", "mixed_workload",
           "mixed_lengths", "describe_lengths", "file_workload", "read_requests", "CONCURRENCY_HELP", "REQUESTS_HELP",
           "check_counts"]

WORKLOADS = ("long", "short", "mixed", "file")

REQUESTS_HELP = (f"Requests (long: per length, default {long.DEFAULT_NUM_REQUESTS}; short: {short.DEFAULT_NUM_REQUESTS}; "
                 f"mixed: {mixed.DEFAULT_NUM_REQUESTS}).")
"""``simulate --requests``'s help: the defaults ``build_workload`` applies, from the workloads' own constants."""
CONCURRENCY_HELP = (f"Closed-loop clients (default: long {long.DEFAULT_CONCURRENCY}, short all, mixed "
                    f"{mixed.DEFAULT_CONCURRENCY}, file open loop).")
"""``simulate --concurrency``'s help, built as ``REQUESTS_HELP``."""

# A flag a workload would ignore is refused: the run would not be the one asked for.
# Only mixed draws anything at random (--jitter draws with its own --jitter-seed).
_UNREAD_FLAGS = {"long": ("--file", "--seed"), "short": ("--file", "--seed"), "mixed": ("--seq-len", "--file"),
                 "file": ("--seq-len", "--requests", "--seed")}
_UNREAD_WHY = {"long": "its prompts are --seq-len tokens, nothing drawn at random",
               "short": "its prompts are --seq-len tokens, nothing drawn at random",
               "mixed": "it draws its own lengths, seeded by --seed",
               "file": "the file gives every request's length and arrival"}


_FOR_DEFAULT = "omit it for the workload's default"


def check_counts(num_requests: int | None, concurrency: int | None) -> None:
    """``--requests`` and ``--concurrency`` as given (None: not given, the workload's default);
    ``build_workload`` checks them, and ``simulate`` before it weighs the request count."""
    # ``None`` picks the workload's default; an explicit 0 must not silently become it.
    if num_requests is not None:
        check_workload_requests(num_requests, _FOR_DEFAULT)
    check_concurrency(concurrency, "--concurrency", _FOR_DEFAULT, WorkloadError)


def build_workload(kind: str, *, lengths: list[int] | None = None, num_requests: int | None = None,
                   concurrency: int | None = None, seed: int | None = None, path: str | None = None) -> Workload:
    """One workload by name with the CLI's options; an unknown name lists the valid ones. An
    option left None was not given (``seed``: mixed draws with seed 0)."""
    check_counts(num_requests, concurrency)
    given = {"--seq-len": lengths, "--requests": num_requests, "--file": path, "--seed": seed}
    for flag in _UNREAD_FLAGS.get(kind, ()):
        if given[flag] is not None:
            hint = " (--jitter's draws are seeded by --jitter-seed)" if flag == "--seed" else ""
            raise WorkloadError(f"the {kind} workload does not read {flag} ({_UNREAD_WHY[kind]}); drop {flag}{hint}")
    if kind == "long":
        if not lengths:
            raise WorkloadError("the long workload needs --seq-len (e.g. 512k or 64k,128k)")
        return long_workload(lengths, num_requests or long.DEFAULT_NUM_REQUESTS, concurrency or long.DEFAULT_CONCURRENCY)
    if kind == "short":
        if not lengths:
            raise WorkloadError("the short workload needs --seq-len (one length, e.g. 4k)")
        if len(lengths) != 1:
            raise WorkloadError(f"the short workload takes one --seq-len (e.g. 4k), got {len(lengths)} lengths")
        return short_workload(lengths[0], num_requests or short.DEFAULT_NUM_REQUESTS, concurrency)
    if kind == "mixed":
        return mixed_workload(num_requests or mixed.DEFAULT_NUM_REQUESTS, seed or 0, concurrency or mixed.DEFAULT_CONCURRENCY)
    if kind == "file":
        if not path:
            raise WorkloadError("the file workload needs --file requests.jsonl")
        return file_workload(path, concurrency)
    raise WorkloadError(f"unknown workload {kind!r}; valid: {', '.join(WORKLOADS)}")
