"""Measured per-action costs: the file format the reference runtime writes and the fits read.

One record per executed action (documented in docs/calibration.md):

=============  ==========================================================================
``kind``       ``compute`` (a stage on a chunk) or ``transfer`` (a hand-off of a stage's output)
``stage``      virtual stage index in the measured layout
``request``    request index (schedule numbering)
``chunk``      chunk index within the request
``prefix``     tokens before the chunk (L)
``tokens``     tokens in the chunk (c)
``duration_s`` measured seconds (compute: stage forward; transfer: send start to recv end)
``layers``     optional: layers in the stage (enables per-layer fits portable across layouts)
``rank``       optional: the rank that ran it
``batch``      optional, compute: the other requests of a batched forward (whole short
               prompts that shared it), each as its prefix and tokens; JSON ``[[L, c], ...]``,
               CSV ``L:c L:c``. ``prefix``/``tokens`` are then the lead request's, and the
               duration is the whole forward's
=============  ==========================================================================

JSON: ``{"format": "sglang-vpp.cost-samples", "version": 1, "meta": {...}, "samples": [{...}]}``.
CSV: a header row with the column names above, one sample per row (empty optional cells allowed).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ... import json_text
from ..errors import CostModelError

__all__ = ["CostSample", "SAMPLES_FORMAT", "read_samples", "write_samples", "samples_to_json", "samples_from_json"]

SAMPLES_FORMAT = "sglang-vpp.cost-samples"
_COLUMNS = ("kind", "stage", "request", "chunk", "prefix", "tokens", "duration_s", "layers", "rank", "batch")
_KINDS = ("compute", "transfer")


@dataclass(frozen=True, slots=True)
class CostSample:
    """One measured action (see the module docstring for the fields)."""

    kind: str
    stage_index: int
    request_index: int
    chunk_index: int
    prefix_tokens: int
    num_tokens: int
    duration_s: float
    num_layers: int | None = None
    rank: int | None = None
    batch: tuple[tuple[int, int], ...] = ()
    """(prefix, tokens) of every other request in the same forward; empty: one request."""

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise CostModelError(f"sample kind {self.kind!r} is not one of {_KINDS}")
        if self.num_tokens < 1 or self.prefix_tokens < 0:
            raise CostModelError(f"sample {self} needs tokens >= 1 and prefix >= 0")
        if any(tokens < 1 or prefix < 0 for prefix, tokens in self.batch):
            raise CostModelError(f"sample {self} has a batched part without tokens >= 1 and prefix >= 0")
        if not self.duration_s >= 0:
            raise CostModelError(f"sample {self} has a negative or NaN duration")
        if self.num_layers is not None and self.num_layers < 1:
            raise CostModelError(f"sample {self} has layers {self.num_layers}; a stage runs at least 1 layer")

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.stage_index, self.request_index, self.chunk_index)

    @property
    def parts(self) -> tuple[tuple[int, int], ...]:
        """(prefix, tokens) of every request in the forward, the lead first."""
        return ((self.prefix_tokens, self.num_tokens), *self.batch)

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole forward (``ChunkSpec.total_tokens``)."""
        return self.num_tokens + sum(tokens for _, tokens in self.batch)

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "stage": self.stage_index, "request": self.request_index,
                "chunk": self.chunk_index, "prefix": self.prefix_tokens, "tokens": self.num_tokens,
                "duration_s": self.duration_s}
        if self.num_layers is not None:
            data["layers"] = self.num_layers
        if self.rank is not None:
            data["rank"] = self.rank
        if self.batch:
            data["batch"] = [list(part) for part in self.batch]
        return data

    @staticmethod
    def from_dict(data: dict, where: str = "sample") -> "CostSample":
        missing = [k for k in _COLUMNS[:7] if data.get(k) in (None, "")]
        if missing:
            raise CostModelError(f"{where}: missing fields {missing}; every sample needs {list(_COLUMNS[:7])}")
        try:
            return CostSample(
                str(data["kind"]), int(data["stage"]), int(data["request"]), int(data["chunk"]),
                int(data["prefix"]), int(data["tokens"]), float(data["duration_s"]),
                _opt_int(data.get("layers")), _opt_int(data.get("rank")), _batch(data.get("batch")),
            )
        except (TypeError, ValueError) as error:
            if isinstance(error, CostModelError):
                raise
            raise CostModelError(f"{where}: cannot read {data!r}: {error}") from None


def _opt_int(value) -> int | None:
    return None if value in (None, "") else int(value)


def _batch(value) -> tuple[tuple[int, int], ...]:
    """JSON ``[[L, c], ...]`` or CSV ``"L:c L:c"``; absent or empty: no batch."""
    if value in (None, "", []):
        return ()
    pairs = [part.split(":") for part in value.split()] if isinstance(value, str) else value
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"batch must be [prefix, tokens] pairs (CSV: 'prefix:tokens ...'), got {value!r}")
    return tuple((int(prefix), int(tokens)) for prefix, tokens in pairs)


def _csv_row(sample: "CostSample") -> dict:
    row = sample.to_dict()
    row["batch"] = " ".join(f"{prefix}:{tokens}" for prefix, tokens in sample.batch)
    return {column: row.get(column, "") for column in _COLUMNS}


def samples_to_json(samples: Iterable[CostSample], meta: dict | None = None) -> dict:
    return {"format": SAMPLES_FORMAT, "version": 1, "meta": meta or {},
            "samples": [s.to_dict() for s in samples]}


def samples_from_json(data: dict) -> list[CostSample]:
    if data.get("format") != SAMPLES_FORMAT:
        raise CostModelError(f"not a cost-samples file: format is {data.get('format')!r}, expected {SAMPLES_FORMAT!r}")
    return [CostSample.from_dict(d, f"sample {i}") for i, d in enumerate(data.get("samples", []))]


def write_samples(samples: Iterable[CostSample], path: str | Path, meta: dict | None = None) -> None:
    """Write ``.json`` (with ``meta``) or ``.csv`` by the file suffix."""
    path = Path(path)
    if path.suffix == ".csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=_COLUMNS)
        writer.writeheader()
        for sample in samples:
            writer.writerow(_csv_row(sample))
        path.write_text(buffer.getvalue())
    elif path.suffix == ".json":
        path.write_text(json.dumps(samples_to_json(samples, meta), indent=1) + "\n")
    else:
        raise CostModelError(f"cost samples path {str(path)!r} must end in .json or .csv")


def read_samples(path: str | Path) -> list[CostSample]:
    """Read a ``.json`` or ``.csv`` samples file."""
    path = Path(path)
    if not path.exists():
        raise CostModelError(f"cost samples file {str(path)!r} does not exist")
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            return [CostSample.from_dict(row, f"{path}:{i + 2}") for i, row in enumerate(csv.DictReader(handle))]
    if path.suffix == ".json":
        return samples_from_json(json_text.loads(path.read_text()))
    raise CostModelError(f"cost samples path {str(path)!r} must end in .json or .csv")
