"""``TableCostModel``: replays exact measured per-action costs keyed by (stage, request, chunk).

Data flow: ``CostSample``\\ s -> ``fit`` (median of repeats per key) -> ``stage_cost`` /
``transfer_cost`` look the action up. This is how a measured run is replayed through the
simulator to check that the simulator's accounting matches the runtime's profile. A missing key
goes to ``fallback`` (e.g. a ``FittedCostModel`` of the same samples) or raises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Iterable

from ... import json_text
from ...schedule import ChunkSpec, StageCostModel, StageSpec
from ..errors import CostModelError
from .samples import CostSample

__all__ = ["TableCostModel", "TABLE_FORMAT"]

TABLE_FORMAT = "sglang-vpp.table-cost"
Key = tuple[int, int, int]


@dataclass(frozen=True)
class TableCostModel(StageCostModel):
    compute: dict[Key, float] = field(default_factory=dict)
    """Seconds per (stage, request, chunk) compute."""
    transfer: dict[Key, float] = field(default_factory=dict)
    """Seconds per hand-off of (producing stage, request, chunk); missing transfers cost 0 unless
    ``strict_transfers``."""
    fallback: StageCostModel | None = None
    strict_transfers: bool = False

    def stage_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        key = (stage.stage_index, chunk.request_index, chunk.chunk_index)
        value = self.compute.get(key)
        if value is not None:
            return value
        if self.fallback is not None:
            return self.fallback.stage_cost(stage, chunk)
        raise CostModelError(
            f"no measured compute for stage {key[0]} request {key[1]} chunk {key[2]} "
            f"({len(self.compute)} measured actions); replay the schedule that was measured, or pass "
            "fallback=fit_cost_model(samples)")

    def transfer_cost(self, stage: StageSpec, chunk: ChunkSpec) -> float:
        key = (stage.stage_index, chunk.request_index, chunk.chunk_index)
        value = self.transfer.get(key)
        if value is not None:
            return value
        if self.fallback is not None:
            return self.fallback.transfer_cost(stage, chunk)
        if self.strict_transfers:
            raise CostModelError(f"no measured transfer for stage {key[0]} request {key[1]} chunk {key[2]}")
        return 0.0

    @classmethod
    def fit(cls, samples: Iterable[CostSample], fallback: StageCostModel | None = None) -> "TableCostModel":
        """Median duration per key (repeated runs of one schedule collapse to one number)."""
        groups: dict[str, dict[Key, list[float]]] = {"compute": {}, "transfer": {}}
        for sample in samples:
            groups[sample.kind].setdefault(sample.key, []).append(sample.duration_s)
        if not groups["compute"]:
            raise CostModelError("no compute samples: a table model needs the measured stage computes")
        return cls({k: median(v) for k, v in groups["compute"].items()},
                   {k: median(v) for k, v in groups["transfer"].items()}, fallback)

    def to_json(self) -> dict:
        return {"format": TABLE_FORMAT, "version": 1,
                "compute": [[*k, v] for k, v in sorted(self.compute.items())],
                "transfer": [[*k, v] for k, v in sorted(self.transfer.items())]}

    @classmethod
    def from_json(cls, data: dict, fallback: StageCostModel | None = None) -> "TableCostModel":
        if data.get("format") != TABLE_FORMAT:
            raise CostModelError(f"not a table cost model: format {data.get('format')!r}, expected {TABLE_FORMAT!r}")
        def seconds(value: object) -> float:
            # A measured time: NaN, infinite or negative ones would run as meaningless timelines;
            # float() would read "0.5" and true (1 s) as times.
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"a time of {value!r}, not a number of seconds")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"a time of {float(value)} s, not a finite number >= 0")
            return float(value)

        def index(value: object) -> int:
            # int() would read stage 0.7 as 0 and true as 1; a negative index names no action, so
            # the row would never be looked up and its action would run on the fallback.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 0:
                raise ValueError(f"an index of {value!r}, not a whole number >= 0")
            return int(value)

        def read(rows: list) -> dict:
            return {(index(s), index(r), index(c)): seconds(v) for s, r, c, v in rows}

        try:
            compute = read(data.get("compute", []))
            transfer = read(data.get("transfer", []))
        except (TypeError, ValueError, OverflowError) as error:  # OverflowError: an index of Infinity
            raise CostModelError(f"a malformed {TABLE_FORMAT} file ({type(error).__name__}: {error}); rows are "
                                 "[stage, request, chunk, seconds]") from None
        if not compute:  # as ``fit``: every action would run on the fallback, none on a measured time
            raise CostModelError(f"a {TABLE_FORMAT} file with no \"compute\" rows: a table model needs the measured "
                                 "stage computes")
        return cls(compute, transfer, fallback)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: str | Path, fallback: StageCostModel | None = None) -> "TableCostModel":
        return cls.from_json(json_text.loads(Path(path).read_text()), fallback)
