"""The schema of a server's pipeline trace (``--vpp-trace DIR``): written by the plugin
(``sglang_plugin/accounting.py``, ``vpp/event_loop.py``), read by ``serving`` (``check --trace``,
the pipeline report) and by the tests. One place for the file names and every record's fields.

Per rank ``r``, ``DIR/vpp_rank<r>.records.json`` holds::

    {"summary": {...}, "counters": {...},
     "records":    [ComputeRecord as a dict, ...],       # every stage compute, in order
     "controller": {mode, pp_size, stage_layers, max_in_flight, chunk_size, cost},
     "decisions":  [{"kind": "admit" | "hold" | "left" | "pick" | "chunk" | "decode", ...}, ...]}

``controller`` is empty for the stock modes (cpp, dcpp), which SGLang's own loop schedules.
Decision records: ``admit`` (``decision``: ``yes`` | ``packed``) and ``hold`` carry a micro-batch
(``micro_batch_record``); ``left`` a ``seq``; ``pick`` the ``ready`` items and the ``chosen`` one,
each ``[stage, seq]``; ``decode`` the slot a prefill ended in (``from_slot``), the
``running`` requests of each decode slot that could take it (``[slot, count]`` pairs) and the
``chosen`` slot (null: none could). ``DIR/vpp_rank<r>.json`` is the Perfetto (Chrome JSON) view of ``records``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .schedule import LinearAttentionCost, MicroBatch, StageCostModel
from .schedule.errors import CostModelError
from .schedule.fitted_cost import FittedCostModel

__all__ = ["ComputeRecord", "ADMIT", "HOLD", "LEFT", "PICK", "CHUNK", "DECODE", "DECISION_KINDS", "records_file", "chrome_trace_file",
           "RECORDS_GLOB", "rank_of_records_file", "micro_batch_record", "micro_batch_from_record", "cost_record",
           "cost_from_record"]

ADMIT, HOLD, LEFT, PICK = "admit", "hold", "left", "pick"
CHUNK = "chunk"
"""An ``auto`` chunker's cut: ``prefix`` tokens already chunked, ``remaining``, and the ``size`` cut."""
DECODE = "decode"
"""The decode slot a request joins when its prefill ends in a prefill-only slot
(``Controller.decode_join``)."""
DECISION_KINDS = (ADMIT, HOLD, LEFT, PICK, CHUNK, DECODE)
RECORDS_GLOB = "vpp_rank*.records.json"


@dataclass(frozen=True, slots=True)
class ComputeRecord:
    """One stage compute of a rank."""

    rank: int
    stage: int
    seq: int
    is_prefill: bool
    num_tokens: int
    start_s: float
    """Wall clock, seconds since the loop started."""
    end_s: float
    cpu_s: float
    """Thread CPU time of the compute."""


def records_file(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"vpp_rank{rank}.records.json"


def chrome_trace_file(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"vpp_rank{rank}.json"


def rank_of_records_file(path: Path) -> int:
    """The rank a records file belongs to; ValueError for another name."""
    return int(path.name[len("vpp_rank"):].split(".")[0])


def micro_batch_record(mb: MicroBatch, names: Sequence[str] | None = None) -> dict:
    """The fields of an ``admit`` / ``hold`` record; ``names`` maps request indices to ids."""
    requests = sorted(names[r] if names is not None else str(r) for r in mb.requests)
    return {"seq": mb.seq, "requests": requests, "start": mb.start, "tokens": mb.num_tokens,
            "ends_request": mb.ends_request, "prefill": mb.is_prefill}


def micro_batch_from_record(record: dict) -> MicroBatch:
    return MicroBatch(int(record["seq"]), frozenset(record["requests"]), int(record["start"]), int(record["tokens"]),
                      bool(record["ends_request"]), bool(record["prefill"]))


def cost_record(cost: StageCostModel) -> dict:
    """The controller's cost estimate as the trace stores it."""
    if isinstance(cost, LinearAttentionCost):
        return {"kind": "linear-attention", "linear_per_token": cost.linear_per_token,
                "attention_per_pair": cost.attention_per_pair, "fixed_per_chunk": cost.fixed_per_chunk}
    if isinstance(cost, FittedCostModel):
        return {"kind": "fitted", "model": cost.to_json()}
    raise CostModelError(f"a trace cannot record a {type(cost).__name__}; use LinearAttentionCost or FittedCostModel")


def cost_from_record(record: dict) -> StageCostModel:
    """Inverse of ``cost_record``; CostModelError for an unknown kind."""
    if record.get("kind") == "fitted":
        return FittedCostModel.from_json(record["model"])
    if record.get("kind") != "linear-attention":
        raise CostModelError(f"unknown cost model {record.get('kind')!r} in the trace; expected 'linear-attention' "
                             "or 'fitted'")
    return LinearAttentionCost(float(record["linear_per_token"]), float(record["attention_per_pair"]),
                               float(record["fixed_per_chunk"]))
