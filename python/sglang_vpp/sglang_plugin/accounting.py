"""Per-rank compute/idle accounting of a pipeline rank and an optional Perfetto trace.

Used by the VPP loop (``vpp/event_loop.py``) and by ``stock_trace.py`` (cpp / dcpp), so every
mode writes the same files and ``sglang_vpp.serving`` reads them alike.

Every stage compute is recorded with its wall-clock interval and its thread CPU time. On shared
CPUs the wall clock of one rank includes time the OS gave to the other ranks, so the summary
reports both; ``serving/record_replay.py`` rebuilds the dedicated-hardware timeline from the
CPU times.

Trace format: Chrome JSON trace events (open in https://ui.perfetto.dev), pid = rank,
tid = 0 for compute; one "X" event per stage compute named like the action IR (``3F12``:
stage 3 of micro-batch 12). Written to ``<trace_dir>/vpp_rank<r>.json`` with the raw records
in ``<trace_dir>/vpp_rank<r>.records.json`` whenever the loop goes idle (atomic replace).

The records file also carries the controller's inputs and decisions, in the order the rank made
them, so ``sglang-vpp check --trace`` can replay them offline (``serving/decision_replay.py``).
Every field and file name: ``sglang_vpp/trace_records.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

from sglang_vpp.trace_records import (
    ARRIVALS,
    BUILDS,
    CLOCK_ORIGIN,
    DECISION_KINDS,
    PROFILE_ENV,
    SCHEMA,
    SCHEMA_VERSION,
    ComputeRecord,
    chrome_trace_file,
    profile_file,
    records_file,
)

__all__ = ["RankAccounting"]


@dataclass
class RankAccounting:
    rank: int
    trace_dir: str | None = None
    records: list[ComputeRecord] = field(default_factory=list)
    origin: float = field(default_factory=time.perf_counter)
    counters: dict[str, int] = field(default_factory=dict)
    """Loop counters written with the records (e.g. ``num_packed`` micro-batches on rank 0)."""
    controller: dict = field(default_factory=dict)
    """What the controller was built from (empty for the stock modes, which have none)."""
    decisions: list[dict] = field(default_factory=list)
    """The controller's decisions on this rank, in order (see the module doc)."""
    arrivals: list[dict] = field(default_factory=list)
    """Hidden-state messages received, with their arrival times (``trace_records``)."""
    builds: list[dict] = field(default_factory=list)
    """Micro-batches SGLang built on rank 0, with their slots and times."""
    _last_end_cpu: float | None = field(default=None, init=False, repr=False)
    """Thread CPU time at the end of the previous compute (``host_cpu_s`` of the next)."""
    _written: tuple | None = field(default=None, init=False, repr=False)
    """What the files on disk hold (record count, counters); ``write`` skips when unchanged."""

    def __post_init__(self) -> None:
        # Where a loop's host time goes (docs/cpu-measurements.md): cProfile of the scheduler
        # thread (the one that builds this object), dumped at every write; off unless asked.
        self._profile = None
        if self.trace_dir and os.environ.get(PROFILE_ENV):
            import cProfile

            self._profile = cProfile.Profile(time.thread_time)  # CPU, not the waits for a peer
            self._profile.enable()

    def timed(self, stage: int, seq: int, is_prefill: bool, num_tokens: int, **waits: float | None):
        """Context manager recording one compute whose identity is known before it runs;
        ``waits``: its ``poll_s`` / ``idle_s`` / ``woke_s`` (``ComputeRecord``)."""
        return _Timer(self, stage, seq, is_prefill, num_tokens, waits)

    def now(self) -> float:
        """Seconds on this record's clock."""
        return time.perf_counter() - self.origin

    def arrival(self, stage: int, seq: int, arrived: float) -> None:
        """A hidden-state message of ``stage``'s micro-batch ``seq`` arrived at ``perf_counter``
        time ``arrived``."""
        if self.trace_dir:
            self.arrivals.append({"stage": stage, "seq": seq, "t_s": arrived - self.origin})

    def build(self, seq: int, slot: int, t_s: float) -> None:
        if self.trace_dir:
            self.builds.append({"seq": seq, "slot": slot, "t_s": t_s})

    def start(self) -> tuple[float, float]:
        """(wall, thread CPU) now; pass to ``finish`` once the compute's identity is known."""
        return time.perf_counter(), time.thread_time()

    def finish(self, started: tuple[float, float], *, stage: int, seq: int, is_prefill: bool, num_tokens: int,
               waits: dict | None = None) -> None:
        wall0, cpu0 = started
        host = 0.0 if self._last_end_cpu is None else max(0.0, cpu0 - self._last_end_cpu)
        end_cpu = time.thread_time()
        self._last_end_cpu = end_cpu
        if not self.trace_dir:  # a server without --vpp-trace keeps no records (they grow per forward)
            return
        self.records.append(
            ComputeRecord(
                rank=self.rank,
                stage=stage,
                seq=seq,
                is_prefill=is_prefill,
                num_tokens=num_tokens,
                start_s=wall0 - self.origin,
                end_s=time.perf_counter() - self.origin,
                cpu_s=end_cpu - cpu0,
                host_cpu_s=host,
                **(waits or {}),
            )
        )

    def decision(self, kind: str, **fields) -> None:
        """Record one controller decision (only with a trace directory: a server without
        ``--vpp-trace`` keeps no decision log)."""
        assert kind in DECISION_KINDS, kind
        if self.trace_dir:
            self.decisions.append({"kind": kind, **fields})

    def summary(self, prefill_only: bool = True) -> dict:
        """Compute time and idle time inside the window from the first to the last compute."""
        records = [r for r in self.records if r.is_prefill or not prefill_only]
        if not records:
            return {"rank": self.rank, "num_computes": 0, "compute_s": 0.0, "cpu_s": 0.0, "window_s": 0.0, "idle_s": 0.0}
        window = max(r.end_s for r in records) - min(r.start_s for r in records)
        compute = sum(r.end_s - r.start_s for r in records)
        return {
            "rank": self.rank,
            "num_computes": len(records),
            "compute_s": compute,
            "cpu_s": sum(r.cpu_s for r in records),
            "window_s": window,
            "idle_s": max(0.0, window - compute),
        }

    def write(self) -> None:
        """Rewrite the trace files, unless they already hold everything recorded (callers write on
        every idle moment, which can come many times without new work)."""
        state = (len(self.records), len(self.decisions), tuple(sorted(self.counters.items())))
        if not self.trace_dir or not self.records or state == self._written:
            return
        os.makedirs(self.trace_dir, exist_ok=True)
        events = [
            {
                "name": f"{r.stage}F{r.seq}",
                "ph": "X",
                "pid": r.rank,
                "tid": 0,
                "ts": r.start_s * 1e6,
                "dur": (r.end_s - r.start_s) * 1e6,
                "args": {"cpu_ms": r.cpu_s * 1e3, "tokens": r.num_tokens, "prefill": r.is_prefill},
            }
            for r in self.records
        ]
        self._atomic_write(chrome_trace_file(self.trace_dir, self.rank).name, {"traceEvents": events, "displayTimeUnit": "ms"})
        self._atomic_write(
            records_file(self.trace_dir, self.rank).name,
            {SCHEMA: SCHEMA_VERSION, CLOCK_ORIGIN: self.origin, "summary": self.summary(),
             "counters": dict(self.counters), "records": [asdict(r) for r in self.records],
             "controller": self.controller, "decisions": self.decisions, ARRIVALS: self.arrivals,
             BUILDS: self.builds},
        )
        self._written = state
        if self._profile is not None:
            self._profile.dump_stats(profile_file(self.trace_dir, self.rank))
            self._profile.enable()  # dumping disables it

    def _atomic_write(self, name: str, payload: dict) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.trace_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        os.replace(tmp, os.path.join(self.trace_dir, name))


class _Timer:
    def __init__(self, owner: RankAccounting, stage: int, seq: int, is_prefill: bool, num_tokens: int,
                 waits: dict) -> None:
        self.owner, self.stage, self.seq, self.is_prefill, self.num_tokens = owner, stage, seq, is_prefill, num_tokens
        self.waits = waits

    def __enter__(self) -> "_Timer":
        self.started = self.owner.start()
        return self

    def __exit__(self, *exc) -> None:
        self.owner.finish(
            self.started, stage=self.stage, seq=self.seq, is_prefill=self.is_prefill, num_tokens=self.num_tokens,
            waits=self.waits,
        )
