"""Workloads for ``sglang-vpp bench-serve``: the requests to send, deterministic for a seed.

- ``long``: one request at a time (concurrency 1), 4 requests of 8192 input tokens.
- ``short``: 16 requests of 1024 input tokens, all concurrent.
- ``mixed``: 32 requests, input lengths log-normal around --input-len (p90/median = 6.4, the
  shape of the VPP paper's mixed trace), clipped to [7, --max-input-len], concurrency 16.
- ``file``: JSONL, one request per line, the format ``sglang-vpp simulate --workload file`` reads:
  {"length": N} (or "input_len" / "prompt_len"), an optional "arrival" (used by simulate; here
  --request-rate paces the requests), blank and ``#`` lines skipped; bench-serve also takes
  {"input_ids": [...]} or {"text": "..."} instead of a length, and an optional "output_len".
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = ["BenchRequest", "BenchServeError", "FIRST_TOKEN_ID", "WORKLOADWORKLOAD_DEFAULTS", "Workload", "make_workload",
           "random_ids"]


class Workload(StrEnum):
    LONG = "long"
    SHORT = "short"
    MIXED = "mixed"
    FILE = "file"


# Per workload: (num_requests, input_len, output_len, concurrency).
WORKLOAD_DEFAULTS: dict[Workload, tuple[int, int, int, int]] = {
    Workload.LONG: (4, 8192, 16, 1),
    Workload.SHORT: (16, 1024, 16, 16),
    Workload.MIXED: (32, 1024, 16, 16),
    Workload.FILE: (0, 0, 16, 16),
}
# Log-normal spread of the mixed workload: p90 / median = 6.4 -> sigma = ln(6.4) / z(0.9).
_MIXED_SIGMA = math.log(6.4) / 1.2815515655446004


class BenchServeError(ValueError):
    """A bad bench-serve option or workload file; the message names the value and the fix."""


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One request to send: token ids (preferred, tokenizer-free) or text."""

    index: int
    output_len: int
    input_ids: tuple[int, ...] | None = None
    text: str | None = None

    @property
    def input_len(self) -> int | None:
        return len(self.input_ids) if self.input_ids is not None else None

    def payload(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": self.output_len,
                "ignore_eos": True,
            },
            "stream": True,
        }
        if self.input_ids is not None:
            body["input_ids"] = list(self.input_ids)
        else:
            body["text"] = self.text
        return body






#: The keys a workload file may give a prompt length under (shared with simulate's files).
_LENGTH_KEYS = ("length", "input_len", "prompt_len")
#: Random ids start here: below are the special tokens that tokenizers put first.
FIRST_TOKEN_ID = 10


def random_ids(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(length))


def _read_workload_file(path: Path, output_len: int, vocab_size: int, seed: int) -> list[BenchRequest]:
    if not path.is_file():
        raise BenchServeError(f"--workload file needs --file PATH to a JSONL file; {path} does not exist")
    rng = random.Random(seed)
    requests = []
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchServeError(f"{path}:{line_number}: not JSON ({exc.msg}); one object per line") from None
        out_len = int(entry.get("output_len", output_len))
        if "input_ids" in entry:
            requests.append(BenchRequest(len(requests), out_len, input_ids=tuple(entry["input_ids"])))
        elif "text" in entry:
            requests.append(BenchRequest(len(requests), out_len, text=str(entry["text"])))
        elif (key := next((k for k in _LENGTH_KEYS if k in entry), None)) is not None:
            ids = random_ids(rng, int(entry[key]), vocab_size)
            requests.append(BenchRequest(len(requests), out_len, input_ids=ids))
        else:
            raise BenchServeError(
                f"{path}:{line_number}: needs one of {', '.join(_LENGTH_KEYS)}, input_ids or text, "
                f"got keys {sorted(entry)}"
            )
    if not requests:
        raise BenchServeError(f"{path} holds no requests; write one JSON object per line")
    return requests


def make_workload(
    workload: Workload,
    num_requests: int,
    input_len: int,
    output_len: int,
    *,
    seed: int = 0,
    vocab_size: int = 10000,
    max_input_len: int | None = None,
    file: Path | None = None,
) -> list[BenchRequest]:
    """The requests of a workload (see module docstring); deterministic for a seed."""
    if workload == Workload.FILE:
        if file is None:
            raise BenchServeError("--workload file needs --file PATH (a JSONL file, one request per line)")
        return _read_workload_file(file, output_len, vocab_size, seed)
    for name, value in (("--num-requests", num_requests), ("--input-len", input_len), ("--output-len", output_len)):
        if value < 1:
            raise BenchServeError(f"{name} must be >= 1, got {value}")
    rng = random.Random(seed)
    if workload == Workload.MIXED:
        ceiling = max_input_len or 12 * input_len
        lengths = [
            min(ceiling, max(7, round(rng.lognormvariate(math.log(input_len), _MIXED_SIGMA))))
            for _ in range(num_requests)
        ]
    else:
        lengths = [input_len] * num_requests
    return [
        BenchRequest(index, output_len, input_ids=random_ids(rng, length, vocab_size))
        for index, length in enumerate(lengths)
    ]
