"""The schema of a server's pipeline trace (``--vpp-trace DIR``): written by the plugin
(``sglang_plugin/accounting.py``, ``vpp/event_loop.py``), read by ``serving`` (``check --trace``,
the pipeline report) and by the tests. One place for the file names and every record's fields.

Per rank ``r``, ``DIR/vpp_rank<r>.records.json`` holds::

    {"schema": 2, "clock_origin_s": float, "summary": {...}, "counters": {...},
     "records":    [ComputeRecord as a dict, ...],       # every stage compute, in order
     "controller": {mode, pp_size, stage_layers, max_in_flight, chunk_size, cost},
     "decisions":  [{"kind": "admit" | "hold" | "left" | "pick" | "chunk" | "decode" | "resize",
                     ...}, ...],
     "arrivals":   [{"stage", "seq", "t_s"}, ...],        # VPP: each hidden-state message received
     "builds":     [{"seq", "slot", "t_s"}, ...]}         # VPP rank 0: each micro-batch SGLang built

``controller`` is empty for the stock modes (cpp, dcpp), which SGLang's own loop schedules.
Decision records: ``admit`` (``decision``: ``yes`` | ``packed``) and ``hold`` carry a micro-batch
(``micro_batch_record``); ``left`` a ``seq``; ``pick`` the ``ready`` items and the ``chosen`` one,
each ``[stage, seq]``; ``decode`` the prefill-only slot whose requests wait to decode (``from_slot``), the
``running`` requests of each decode slot that could take it (``[slot, count]`` pairs) and the
``chosen`` slot (null: none could); ``chunk`` an ``auto`` chunker's cut (``prefix``,
``remaining``, ``size``); ``resize`` an ``auto`` situation (``lengths``) and the cut chosen for it
(``size``, ``tapered``; a trace without resize records replays its chunk records alone). The
``controller`` inputs of an ``auto`` server carry ``auto_chunk_cap``, ``auto_taper`` (whether
auto weighed the tapered cut; absent: it did not) and ``auto_partial_fill`` (whether auto planned
SGLang's partial fill of a batch; absent: it did not). ``DIR/vpp_rank<r>.json`` is the Perfetto (Chrome JSON) view of ``records``.

Times are seconds on the rank's ``time.perf_counter`` since ``clock_origin_s`` (that clock's
value when the loop started; one clock for every rank of a host). What ``check --trace
--reproduce`` feeds its engine with (schema 2; files without ``schema`` are schema 1, which
that check refuses): an arrival's ``t_s`` is when the receiving rank's inbox got the message
(``stage``: the stage that produced it); a build's ``t_s`` is the poll at which SGLang formed
micro-batch ``seq`` in ``slot``; a compute's ``poll_s`` is the poll whose messages it chose
from, ``idle_s`` when the rank, finding nothing to run after its previous compute, began to
wait, ``woke_s`` the arrival that ended that wait (None where no wait or no message ended it).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .schedule import LinearAttentionCost, MicroBatch, StageCostModel
from .schedule.errors import CostModelError
from .schedule.fitted_cost import FittedCostModel

__all__ = ["ComputeRecord", "ADMIT", "HOLD", "LEFT", "PICK", "CHUNK", "DECODE", "RESIZE", "DECISION_KINDS", "records_file", "chrome_trace_file",
           "RECORDS_GLOB", "PROFILE_ENV", "profile_file", "SCHEMA", "SCHEMA_VERSION", "CLOCK_ORIGIN", "CLOCK_FIELDS", "ARRIVALS", "BUILDS",
           "rank_of_records_file", "micro_batch_record", "micro_batch_from_record", "cost_record",
           "cost_from_record"]

ADMIT, HOLD, LEFT, PICK = "admit", "hold", "left", "pick"
CHUNK = "chunk"
"""An ``auto`` chunker's cut: ``prefix`` tokens already chunked, ``remaining``, and the ``size`` cut."""
DECODE = "decode"
"""The decode slot the requests of a prefill-only slot join, or ``chosen`` None: they are held
(not decoded) until one opens (``Controller.decode_move`` / ``decode_joins``;
``DecodeMove.record`` writes its fields)."""
RESIZE = "resize"
"""An ``auto`` server's situation and the size chosen for it (``Controller.resize``): the prompt
``lengths`` waiting and in flight when rank 0 formed a batch, and the ``size`` (chunk size of
the next requests and budget of a batch of new ones). Every rank records the size it applied."""
DECISION_KINDS = (ADMIT, HOLD, LEFT, PICK, CHUNK, DECODE, RESIZE)
RECORDS_GLOB = "vpp_rank*.records.json"
SCHEMA, SCHEMA_VERSION = "schema", 2
CLOCK_ORIGIN, ARRIVALS, BUILDS = "clock_origin_s", "arrivals", "builds"


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
    host_cpu_s: float = 0.0
    """Thread CPU time of the rank's scheduler thread from the end of its previous compute to the
    start of this one: the host work between two forwards (scheduling, batch building, messages,
    TP agreement, processing results). 0 for a rank's first compute and in files written before
    the field existed; an idle stretch before this compute counts in full (the stock loop
    spins while idle), so readers take medians (``serving/host_time.py``)."""
    poll_s: float | None = None
    idle_s: float | None = None
    woke_s: float | None = None


CLOCK_FIELDS = ("start_s", "end_s", "poll_s", "idle_s", "woke_s")
"""The ``ComputeRecord`` fields that are times on the rank's clock (the others are durations)."""


PROFILE_ENV = "SGLANG_VPP_PROFILE"
"""Set (to anything) in a server's environment with ``--vpp-trace DIR``: each rank's scheduler
thread runs under cProfile and dumps ``profile_file`` whenever it writes its records."""


def profile_file(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"vpp_rank{rank}.prof"


def records_file(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"vpp_rank{rank}.records.json"


def chrome_trace_file(trace_dir: str | Path, rank: int) -> Path:
    return Path(trace_dir) / f"vpp_rank{rank}.json"


def rank_of_records_file(path: Path) -> int:
    """The rank a records file belongs to; ValueError for another name than ``records_file``
    writes: int() alone also reads 01, +1 or " 1", so a stray copy would stand in for a rank."""
    number = path.name[len("vpp_rank"):].removesuffix(".records.json")
    canonical = number.isascii() and number.isdigit() and str(int(number)) == number
    if not path.name.startswith("vpp_rank") or not canonical:
        raise ValueError(f"{path.name!r} is not a rank's records file, named vpp_rank<r>.records.json with r the "
                         "rank, e.g. vpp_rank0.records.json")
    return int(number)


def micro_batch_record(mb: MicroBatch, names: Sequence[str] | None = None) -> dict:
    """The fields of an ``admit`` / ``hold`` record; ``names`` maps request indices to ids."""
    requests = sorted(names[r] if names is not None else str(r) for r in mb.requests)
    return {"seq": mb.seq, "requests": requests, "start": mb.start, "tokens": mb.num_tokens,
            "ends_request": mb.ends_request, "prefill": mb.is_prefill}


def micro_batch_from_record(record: dict) -> MicroBatch:
    """The micro-batch of an ``admit`` / ``hold`` record; ValueError for a field that is not a
    whole number in its range (``int()`` alone would truncate ``1.5`` into another micro-batch's
    number, and a negative prefix fails deep in the controller)."""
    requests = record["requests"]
    if not isinstance(requests, list):
        raise ValueError(f"requests must be a list of request ids, got {requests!r}")
    return MicroBatch(_whole(record, "seq", 0), frozenset(requests), _whole(record, "start", 0),
                      _whole(record, "tokens", 0), bool(record["ends_request"]), bool(record["prefill"]))


def _whole(record: dict, key: str, least: int) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")) or value != int(value) or value < least:
        raise ValueError(f"{key} must be a whole number >= {least}, got {value!r}")
    return int(value)


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
    if not isinstance(record, dict):
        raise CostModelError(f"the trace's cost model is {record!r}; expected an object with a \"kind\"")
    if record.get("kind") == "fitted":
        if not isinstance(record.get("model"), dict):
            raise CostModelError(f"the trace's fitted cost has model {record.get('model')!r}; expected the "
                                 "fitted model's object")
        return FittedCostModel.from_json(record["model"])
    if record.get("kind") != "linear-attention":
        raise CostModelError(f"unknown cost model {record.get('kind')!r} in the trace; expected 'linear-attention' "
                             "or 'fitted'")
    terms = []
    for key in ("linear_per_token", "attention_per_pair", "fixed_per_chunk"):
        try:
            value = float(record[key])
        except (KeyError, TypeError, ValueError):
            raise CostModelError(f"the trace's linear-attention cost has {key} {record.get(key)!r}; expected "
                                 "seconds, a finite number >= 0") from None
        if not (math.isfinite(value) and value >= 0):  # a time: NaN or a negative one decides nothing
            raise CostModelError(f"the trace's linear-attention cost has {key} {value}; expected seconds, a "
                                 "finite number >= 0")
        terms.append(value)
    return LinearAttentionCost(*terms)
