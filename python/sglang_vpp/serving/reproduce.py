"""Reproduce a VPP server's run from its measured timings (``check --trace DIR --reproduce``).

``check --trace`` replays the server's recorded controller calls: it proves the server obeyed
the controller. This module instead *predicts* the server: an event engine runs the VPP loops
of ``sglang_plugin/vpp/event_loop.py`` (what each rank sees at each poll, when it waits, what
it runs next) on a clock fed by a ``Timings`` source, asks the controller at event time, and
compares every rank's computes and decisions with the server's, record by record, stopping at
the first difference.

Data flow: ``<trace_dir>/vpp_rank<r>.records.json`` (schema 2, ``trace_records``) ->
``MeasuredTimings`` (per-stage durations, hand-off latencies, host gaps) and the micro-batches
SGLang built (contents, slot, build time) -> ``ServerModel.run`` -> ``ReproduceResult``.

What the engine takes from the trace, because it cannot see it: the contents of each
micro-batch and the poll at which SGLang formed it (request arrivals, SGLang's queues and
memory); each compute's duration; each hand-off's latency (sender's compute end to the
receiver's inbox); the host time between a poll and the compute it chose (``lead``), from a
compute's end to the rank's next poll (``tail``), and from the message that ends a wait to the
poll (``wake``). Durations and latencies are keyed by ``(stage, seq)``; host gaps by the
compute's position on its rank, which is the same on both sides up to the first difference.
What it decides itself: which messages a rank has at each poll (arrival <= poll, the inbox's
rule), whether the rank runs, waits or builds, and every controller call (admission, hold,
order). A message is seen by a rank exactly when it arrived before the poll: the server's
inbox stamps arrivals and polls under one lock.

The clock is one for all ranks (``time.perf_counter`` of one host); each rank's times are moved
onto rank 0's with the ``clock_origin_s`` both recorded. ``Timings`` is the seam for another
engine or cost source: ``ModelTimings`` feeds constant host gaps and given durations (tests
build synthetic server traces with it).

Chunk-size records are compared by ``check --trace`` (``decision_replay``), which ``--reproduce``
runs first; the engine compares admissions, holds, departures and picks. Heartbeats, TP
agreement and control-only messages are not modelled: a heartbeat that wakes rank 0 while work
is in flight is the one case the host gaps do not cover.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from ..schedule import GROUP_BACKWARD, GROUP_FORWARD, Admission, Controller, MicroBatch
from ..trace_records import (
    ADMIT,
    ARRIVALS,
    BUILDS,
    CHUNK,
    CLOCK_FIELDS,
    CLOCK_ORIGIN,
    DECODE,
    HOLD,
    LEFT,
    PICK,
    RESIZE,
    SCHEMA,
    SCHEMA_VERSION,
    micro_batch_from_record,
    micro_batch_record,
)
from .decision_replay import TraceError, _build_controller, load_trace

__all__ = ["Build", "Timings", "MeasuredTimings", "ModelTimings", "Difference", "ReproduceResult", "ServerModel",
           "reproduce_trace", "builds_from_trace", "check_timing_records"]

EPS = 1e-9
"""Seconds: recomputed times carry float rounding (far below a nanosecond); real events on the
server's clock are at least a fraction of a microsecond apart."""


@dataclass(frozen=True, slots=True)
class Build:
    """A micro-batch as SGLang formed it on rank 0."""

    mb: MicroBatch
    slot: int
    t_s: float
    """The poll of rank 0 at which SGLang formed it (rank 0's clock)."""


class Timings(Protocol):
    """Where the engine's clock comes from. ``index``: the compute's position on its rank."""

    def count(self, rank: int) -> float:
        """Computes of ``rank`` these timings know (``math.inf``: any)."""

    def compute_s(self, rank: int, stage: int, seq: int) -> float: ...

    def hand_off_s(self, stage: int, seq: int) -> float:
        """From the end of ``stage``'s compute of ``seq`` to its arrival at the next stage's rank."""

    def tail_s(self, rank: int, index: int) -> float:
        """From the end of compute ``index - 1`` (time 0 for the first) to the rank's first poll
        for compute ``index``."""

    def wake_s(self, rank: int, index: int) -> float:
        """From the arrival that ends a wait before compute ``index`` to the poll."""

    def check_s(self, rank: int, index: int) -> float:
        """From the first poll for compute ``index`` to the poll that chooses it, when work was
        already there (a blocking wait that returns at once)."""

    def lead_s(self, rank: int, index: int) -> float:
        """From the poll that chose compute ``index`` to its start."""

    def chain_s(self, rank: int, index: int) -> float:
        """From the end of the fold point's first stage to the start of compute ``index``, its second."""


@dataclass
class ModelTimings:
    """Constant host gaps and given durations (what-ifs and synthetic traces)."""

    durations: Callable[[int, int, int], float]
    """(rank, stage, seq) -> seconds."""
    hand_off: float = 1e-4
    tail: float = 2e-5
    wake: float = 1e-5
    lead: float = 1e-5
    chain: float = 1e-5
    start: float = 0.0

    def count(self, rank: int) -> float:
        return math.inf

    def compute_s(self, rank: int, stage: int, seq: int) -> float:
        return self.durations(rank, stage, seq)

    def hand_off_s(self, stage: int, seq: int) -> float:
        return self.hand_off

    def tail_s(self, rank: int, index: int) -> float:
        return self.start if index == 0 else self.tail

    def wake_s(self, rank: int, index: int) -> float:
        return self.wake

    def check_s(self, rank: int, index: int) -> float:
        return 0.0

    def lead_s(self, rank: int, index: int) -> float:
        return self.lead

    def chain_s(self, rank: int, index: int) -> float:
        return self.chain


class MeasuredTimings:
    """The measured timings of a schema-2 trace (``load_trace``'s rank -> file contents)."""

    def __init__(self, ranks: dict[int, dict]) -> None:
        origin = float(ranks[0][CLOCK_ORIGIN])
        self._records: dict[int, list[dict]] = {}
        self._ends: dict[tuple[int, int], float] = {}
        self._durations: dict[tuple[int, int, int], float] = {}
        self._arrivals: dict[tuple[int, int], float] = {}
        for rank, data in ranks.items():
            shift = float(data[CLOCK_ORIGIN]) - origin
            records = [{k: (v + shift if k in CLOCK_FIELDS and v is not None else v)
                        for k, v in r.items()} for r in data["records"]]
            self._records[rank] = records
            for r in records:
                self._durations[(rank, r["stage"], r["seq"])] = r["end_s"] - r["start_s"]
                self._ends[(r["stage"], r["seq"])] = r["end_s"]
            for a in data[ARRIVALS]:
                self._arrivals[(int(a["stage"]), int(a["seq"]))] = float(a["t_s"]) + shift

    def count(self, rank: int) -> float:
        return len(self._records[rank])

    def edit_duration(self, rank: int, stage: int, seq: int, delta_s: float) -> None:
        """A what-if (and the negative control): one compute takes ``delta_s`` longer."""
        self._durations[(rank, stage, seq)] += delta_s

    def compute_s(self, rank: int, stage: int, seq: int) -> float:
        return self._durations[(rank, stage, seq)]

    def hand_off_s(self, stage: int, seq: int) -> float:
        arrived = self._arrivals.get((stage, seq))
        return math.inf if arrived is None else arrived - self._ends[(stage, seq)]

    def _poll(self, rank: int, index: int) -> float:
        """The poll that chose compute ``index``. The fold point's second stage runs without one
        (the replay takes its start from the first stage's end, ``chain_s``), so it is never asked."""
        poll = self._records[rank][index]["poll_s"]
        if poll is None:
            raise TraceError(f"rank {rank}: records[{index}] has no poll_s, but its compute followed a poll; "
                             "re-record the trace with --vpp-trace")
        return poll

    def _first_poll(self, rank: int, index: int) -> float:
        idle = self._records[rank][index]["idle_s"]
        return idle if idle is not None else self._poll(rank, index)

    def tail_s(self, rank: int, index: int) -> float:
        records = self._records[rank]
        before = records[index - 1]["end_s"] if index else 0.0
        return self._first_poll(rank, index) - before

    def wake_s(self, rank: int, index: int) -> float:
        record = self._records[rank][index]
        if record["woke_s"] is None:  # no wait, or rank 0 woke by itself to build
            return 0.0
        return self._poll(rank, index) - max(self._first_poll(rank, index), record["woke_s"])

    def check_s(self, rank: int, index: int) -> float:
        return self.wake_s(rank, index)

    def lead_s(self, rank: int, index: int) -> float:
        return self._records[rank][index]["start_s"] - self._poll(rank, index)

    def chain_s(self, rank: int, index: int) -> float:
        records = self._records[rank]
        return records[index]["start_s"] - records[index - 1]["end_s"]


@dataclass(frozen=True, slots=True)
class Difference:
    rank: int
    stream: str
    """``compute`` or ``decision``."""
    index: int
    """Position of the record in the rank's stream (decisions without chunk-size records)."""
    expected: str
    """What the engine predicted."""
    observed: str
    """What the server recorded."""

    def describe(self) -> str:
        return (f"rank {self.rank}, {self.stream} record {self.index}: engine expected {self.expected}, "
                f"server recorded {self.observed}")


@dataclass(frozen=True, slots=True)
class ReproduceResult:
    mode: str
    compared: dict[int, int]
    """Rank -> records compared (computes and decisions)."""
    difference: Difference | None

    @property
    def ok(self) -> bool:
        return self.difference is None


class _Stop(Exception):
    def __init__(self, difference: Difference) -> None:
        self.difference = difference


@dataclass
class _Rank:
    rank: int
    controller: Controller
    inbox: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(arrival, direction, stage, seq) of messages not yet run, in arrival order."""
    index: int = 0
    """Position of the next compute."""
    waiting: bool = False
    wait_from: float = 0.0
    computes: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    pending_wait: tuple[float | None, float | None] = (None, None)
    """(idle_s, woke_s) of the next compute, as the server records them."""


class ServerModel:
    """The VPP loops of every rank as an event engine (see the module doc).

    ``expected``: rank -> (compute records, decision records) of a server to compare with; None
    to only run (the engine's own records are then in ``ranks[r].computes / .decisions``)."""

    def __init__(self, inputs: dict, builds: Sequence[Build], timings: Timings,
                 expected: dict[int, tuple[list[dict], list[dict]]] | None = None) -> None:
        self.inputs = inputs
        self.builds = list(builds)
        self.timings = timings
        self.expected = expected
        probe = _build_controller(inputs, 0)
        self.layout = probe.layout
        self.ranks = [_Rank(r, _build_controller(inputs, r)) for r in range(self.layout.num_ranks)]
        self.arrivals: dict[int, list[dict]] = {r: [] for r in range(self.layout.num_ranks)}
        self.built: list[dict] = []
        """Rank 0's builds as the engine made them (``trace_records`` build records)."""
        self._events: list[tuple] = []
        self._order = itertools.count()
        self._now = -math.inf
        """The time of the event being handled: the engine's clock, which never runs back."""
        # Rank 0's loop state (event_loop.LeaderLoop).
        self._next_build = 0
        self._held: Build | None = None
        self._hold_recorded = False
        self._slots: dict[int, int] = {}
        self._jobs: set[int] = set()

    # ------------------------------------------------------------------ driving
    def run(self) -> Difference | None:
        for state in self.ranks:
            if self.timings.count(state.rank) > 0:
                self._push(self.timings.tail_s(state.rank, 0), 1, "check", state.rank)
        try:
            while self._events:
                time, _, _, kind, *args = heapq.heappop(self._events)
                self._now = time
                if kind == "arrive":
                    self._arrive(time, *args)
                elif kind == "check":
                    self._check(time, self.ranks[args[0]])
                else:
                    self._poll(time, self.ranks[args[0]])
            self._check_ends()
        except _Stop as stop:
            return stop.difference
        return None

    def _push(self, time: float, priority: int, kind: str, *args) -> None:
        if time < self._now - EPS:  # a poll before the event that caused it would repeat forever
            rank = args[0]
            raise TraceError(f"the trace's timings put an event of rank {rank} {self._now - time:.6f} s before the "
                             "one that causes it: a record's times are out of order; re-record the trace with "
                             "--vpp-trace")
        # Arrivals first at equal times: a message that arrived at a poll's time is seen.
        heapq.heappush(self._events, (time, priority, next(self._order), kind, *args))

    def _arrive(self, time: float, rank: int, direction: str, stage: int, seq: int) -> None:
        state = self.ranks[rank]
        state.inbox.append((time, direction, stage, seq))
        self.arrivals[rank].append({"stage": stage, "seq": seq, "t_s": time})
        if state.waiting and (rank != 0 or self._jobs):
            state.waiting = False
            state.pending_wait = (state.wait_from, time)
            self._push(time + self.timings.wake_s(rank, state.index), 1, "poll", rank)

    def _check(self, time: float, state: _Rank) -> None:
        """The rank's first poll after a compute: run now, or wait for what it needs."""
        if state.index >= self.timings.count(state.rank):
            return
        if self._ready(time, state, record=True):
            delay = self.timings.check_s(state.rank, state.index)
            if delay > 0:
                self._push(time + delay, 1, "poll", state.rank)
            else:
                self._poll(time, state)
            return
        state.wait_from = time
        if state.rank == 0 and not self._jobs:
            build = self._next_build_after()
            if build is not None:  # rank 0 polls for requests while idle: it builds at once
                state.pending_wait = (time, None)
                self._push(max(time, build.t_s), 1, "poll", 0)
            return
        pending = [t for t, *_ in state.inbox if t > time + EPS]
        if pending:
            state.pending_wait = (time, min(pending))
            self._push(min(pending) + self.timings.wake_s(state.rank, state.index), 1, "poll", state.rank)
        else:
            state.waiting = True

    def _poll(self, time: float, state: _Rank) -> None:
        ready = self._ready(time, state, record=True)
        if not ready:
            self._check(time, state)
            return
        chosen = ready[0]
        if len(ready) > 1:
            chosen = state.controller.pick(state.rank, ready)
            self._decision(state, {"kind": PICK, "ready": [list(i) for i in ready], "chosen": list(chosen)})
        self._run(time, state, *chosen)

    # ------------------------------------------------------------------ what a rank sees
    def _visible(self, time: float, state: _Rank, direction: str) -> tuple[int, int] | None:
        for arrived, d, stage, seq in state.inbox:
            if d == direction and arrived <= time + EPS:
                return stage, seq
        return None

    def _ready(self, time: float, state: _Rank, record: bool) -> list[tuple[int, int]]:
        """The rank's ready ``(stage, seq)`` items in the order its loop lists them."""
        if state.index >= self.timings.count(state.rank):
            return []
        back = self._visible(time, state, GROUP_BACKWARD)
        forward = None
        if state.rank == 0:
            held = self._build(time)
            if held is not None:
                if state.controller.admission(held.mb) is Admission.NO:
                    if record and not self._hold_recorded:
                        self._hold_recorded = True
                        self._decision(state, {"kind": HOLD, **micro_batch_record(held.mb)})
                else:
                    forward = held.mb.seq
        else:
            visible = self._visible(time, state, GROUP_FORWARD)
            forward = None if visible is None else visible[1]
        return state.controller.ready_items(state.rank, None if back is None else back[1], forward)

    def _next_build_after(self) -> Build | None:
        return self.builds[self._next_build] if self._held is None and self._next_build < len(self.builds) else None

    def _build(self, time: float) -> Build | None:
        """Rank 0 forms the next micro-batch once SGLang did, in a free slot."""
        build = self._next_build_after()
        if build is not None and build.t_s <= time + EPS and build.slot not in self._slots:
            self._held, self._hold_recorded = build, False
            self._next_build += 1
            self.built.append({"seq": build.mb.seq, "slot": build.slot, "t_s": time})
        return self._held

    # ------------------------------------------------------------------ running
    def _run(self, time: float, state: _Rank, stage: int, seq: int) -> None:
        start = time + self.timings.lead_s(state.rank, state.index)
        if state.rank == 0 and stage == 0:
            held, self._held = self._held, None
            assert held is not None and held.mb.seq == seq
            decision = state.controller.admission(held.mb)
            state.controller.on_admitted(held.mb, decision)
            self._decision(state, {"kind": ADMIT, "decision": str(decision), **micro_batch_record(held.mb)})
            self._slots[held.slot] = seq
            self._jobs.add(seq)
        else:
            incoming = state.controller.hand_off(stage - 1)
            # None only at the fold point, whose second stage runs chained below, without a poll.
            assert incoming is not None, f"rank {state.rank} polled for stage {stage}"
            direction = incoming.group
            position = next(i for i, (_, d, _, s) in enumerate(state.inbox) if d == direction and s == seq)
            state.inbox.pop(position)
        end = self._compute(state, stage, seq, start, time)
        if stage + 1 < self.layout.num_stages and self.layout.stages[stage + 1].rank == state.rank:
            # [Note: fold point has no comm]: the next stage runs at once, without a poll.
            if state.index >= self.timings.count(state.rank):  # chain_s reads the record it would be
                raise _Stop(Difference(state.rank, "compute", state.index, f"{stage + 1}F{seq}",
                                       "nothing (its records end)"))
            start = end + self.timings.chain_s(state.rank, state.index)
            stage += 1
            end = self._compute(state, stage, seq, start, None)
        if stage == self.layout.last_stage:
            self._decision(state, {"kind": LEFT, "seq": seq})
            state.controller.on_left(seq)
            self._slots = {slot: s for slot, s in self._slots.items() if s != seq}
            self._jobs.discard(seq)
        else:
            outgoing = state.controller.hand_off(stage)
            assert outgoing is not None  # the next stage on this rank ran above
            arrival = end + self.timings.hand_off_s(stage, seq)
            if not math.isinf(arrival):  # inf: the receiver's records end before it
                self._push(arrival, 0, "arrive", outgoing.dst_rank, outgoing.group, stage, seq)
        if state.index < self.timings.count(state.rank):
            self._push(end + self.timings.tail_s(state.rank, state.index), 1, "check", state.rank)

    def _compute(self, state: _Rank, stage: int, seq: int, start: float, poll: float | None) -> float:
        index = state.index
        if index >= self.timings.count(state.rank):
            raise _Stop(Difference(state.rank, "compute", index, f"{stage}F{seq}", "nothing (its records end)"))
        if self.expected is not None:  # before the duration: a compute the server never ran has none
            recorded = self.expected[state.rank][0]
            if index >= len(recorded):
                raise _Stop(Difference(state.rank, "compute", index, f"{stage}F{seq}", "nothing (its records end)"))
            observed = recorded[index]
            if (observed["stage"], observed["seq"]) != (stage, seq):
                raise _Stop(Difference(state.rank, "compute", index, f"{stage}F{seq}",
                                       f"{observed['stage']}F{observed['seq']}"))
        end = start + self.timings.compute_s(state.rank, stage, seq)
        idle, woke = state.pending_wait if poll is not None else (None, None)
        state.pending_wait = (None, None)
        state.computes.append({"stage": stage, "seq": seq, "start_s": start, "end_s": end, "poll_s": poll,
                               "idle_s": idle, "woke_s": woke})
        state.index += 1
        return end

    def _decision(self, state: _Rank, record: dict) -> None:
        index = len(state.decisions)
        state.decisions.append(record)
        if self.expected is None:
            return
        recorded = self.expected[state.rank][1]
        observed = recorded[index] if index < len(recorded) else None
        if observed is None or _decision_key(observed) != _decision_key(record):
            raise _Stop(Difference(state.rank, "decision", index, _decision_text(record),
                                   "nothing more" if observed is None else _decision_text(observed)))

    def _check_ends(self) -> None:
        if self.expected is None:
            return
        for state in self.ranks:
            computes, decisions = self.expected[state.rank]
            if len(state.computes) < len(computes):
                r = computes[len(state.computes)]
                raise _Stop(Difference(state.rank, "compute", len(state.computes), "nothing more (the rank waits)",
                                       f"{r['stage']}F{r['seq']}"))
            if len(state.decisions) < len(decisions):
                raise _Stop(Difference(state.rank, "decision", len(state.decisions), "nothing more",
                                       _decision_text(decisions[len(state.decisions)])))


def _decision_key(record: dict) -> tuple:
    kind = record["kind"]
    if kind == PICK:
        return kind, tuple(map(tuple, record["ready"])), tuple(record["chosen"])
    if kind == ADMIT:
        return kind, int(record["seq"]), record["decision"]
    return kind, int(record["seq"])


def _decision_text(record: dict) -> str:
    kind = record["kind"]
    if kind == PICK:
        ready = ", ".join(f"{s}F{q}" for s, q in record["ready"])
        return f"pick {record['chosen'][0]}F{record['chosen'][1]} of [{ready}]"
    if kind == ADMIT:
        return f"admit micro-batch {record['seq']} ({record['decision']})"
    return f"{kind} micro-batch {record['seq']}"


def builds_from_trace(leader: dict) -> list[Build]:
    """Rank 0's micro-batches: contents from its first hold or admission record, slot and time
    from its build record."""
    contents: dict[int, MicroBatch] = {}
    for record in leader.get("decisions") or []:
        if record["kind"] in (ADMIT, HOLD):
            contents.setdefault(int(record["seq"]), micro_batch_from_record(record))
    builds = []
    for build in leader[BUILDS]:
        seq = int(build["seq"])
        if seq in contents:
            builds.append(Build(contents[seq], int(build["slot"]), float(build["t_s"])))
    return builds


_COUNT, _TIME, _TIME_OR_NONE = "a whole number", "a finite time", "a finite time or null"
_SINCE_ORIGIN = f"a finite time >= 0 (seconds since {CLOCK_ORIGIN})"
_TIMING_FIELDS = {
    "records": {"stage": _COUNT, "seq": _COUNT, "start_s": _TIME, "end_s": _TIME, "poll_s": _TIME_OR_NONE,
                "idle_s": _TIME_OR_NONE, "woke_s": _TIME_OR_NONE},
    ARRIVALS: {"stage": _COUNT, "seq": _COUNT, "t_s": _TIME},
    # A build is a poll of rank 0's loop, which starts at the clock origin.
    BUILDS: {"seq": _COUNT, "slot": _COUNT, "t_s": _SINCE_ORIGIN},
}
"""The fields the engine reads from each timing list (builds: rank 0's only), and what each holds."""


def check_timing_records(ranks: dict[int, dict]) -> None:
    """Every timing the engine reads is a finite number, each stage one of the layout's; else
    ``TraceError`` naming the entry: a missing or NaN time would stall the engine's clock."""
    leader = _build_controller(ranks[0]["controller"], 0)
    num_stages, num_slots = leader.layout.num_stages, leader.limits.slots
    for rank, data in ranks.items():
        if not _holds(data.get(CLOCK_ORIGIN), _TIME):
            raise TraceError(f"rank {rank}: {CLOCK_ORIGIN} is {data.get(CLOCK_ORIGIN)!r}, not {_TIME}")
        for name, fields in _TIMING_FIELDS.items():
            entries = data.get(name, []) if name != BUILDS or rank == 0 else []
            if not isinstance(entries, list):
                raise TraceError(f"rank {rank}: {name!r} is not a list")
            for index, entry in enumerate(entries):
                bad = ([f"{name}[{index}] is not an object"] if not isinstance(entry, dict) else
                       [f"{name}[{index}].{key} is {repr(entry[key]) if key in entry else 'missing'}, not {kind}"
                        for key, kind in fields.items() if not _holds(entry.get(key, ...), kind)])
                if not bad and "stage" in fields and not 0 <= entry["stage"] < num_stages:
                    bad = [f"{name}[{index}].stage is {entry['stage']}, not one of the {num_stages} stages"]
                # A slot SGLang lacks never blocks a build: the engine would run it as if free.
                if not bad and name == BUILDS and not entry["slot"] < num_slots:
                    bad = [f"{name}[{index}].slot is {entry['slot']}, not one of the {num_slots} micro-batch slots"]
                # A compute that ends before it starts runs in negative time: the engine would take
                # it and still report the server reproduced.
                if not bad and name == "records" and entry["end_s"] < entry["start_s"]:
                    bad = [f"{name}[{index}] ends before it starts (start_s {entry['start_s']!r}, end_s "
                           f"{entry['end_s']!r})"]
                # A start moved alone keeps its end: the engine reads the duration and the host gap
                # from it, which absorb the move, so every later record would still match.
                if not bad and name == "records":
                    bad = _start_out_of_order(entries, index)
                if bad:
                    raise TraceError(f"rank {rank}: {bad[0]}; re-record the trace with --vpp-trace")


def _start_out_of_order(records: list[dict], index: int) -> list[str]:
    """Why compute ``index`` could not have started when its record says (none: an empty list):
    before the poll that chose it, or, as the second stage of the fold point (the same
    micro-batch's next stage, right after the first on the same rank), before the first ended.
    Records in another order than their times are left to the replay, which reports the order.
    The records before ``index`` have passed every check (``check_timing_records`` goes in order)."""
    record = records[index]
    poll, start = record.get("poll_s"), record["start_s"]
    if poll is not None and start < poll - EPS:
        return [f"records[{index}] starts {poll - start:.6f} s before the poll that chose it (poll_s {poll!r}, "
                f"start_s {start!r}): a record's times are out of order"]
    first = records[index - 1] if index else None
    if (first is not None and first["seq"] == record["seq"] and first["stage"] == record["stage"] - 1
            and start < first["end_s"] - EPS):
        return [f"records[{index}] starts {first['end_s'] - start:.6f} s before records[{index - 1}], its "
                "micro-batch's previous stage on this rank, ended: a record's times are out of order"]
    return []


def _holds(value: object, kind: str) -> bool:
    if value is None:
        return kind == _TIME_OR_NONE
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind == _COUNT:
        return isinstance(value, int) and value >= 0
    return math.isfinite(value) and (kind != _SINCE_ORIGIN or value >= 0)


def reproduce_trace(trace_dir: str | Path, timings: Timings | None = None) -> ReproduceResult:
    """Predict a traced VPP server from its measured timings (or ``timings``) and compare."""
    ranks = load_trace(trace_dir)
    schemas = {rank: data.get(SCHEMA, 1) for rank, data in ranks.items()}
    for rank, schema in schemas.items():
        if isinstance(schema, bool) or not isinstance(schema, int):
            raise TraceError(f"{str(trace_dir)!r}: rank {rank}'s schema {schema!r} is not a version number")
    # A later schema may mean its fields otherwise: read as this one, its timings could mislead.
    new = [rank for rank, schema in schemas.items() if schema > SCHEMA_VERSION]
    if new:
        raise TraceError(f"{str(trace_dir)!r}: rank {new[0]}'s schema {schemas[new[0]]} is newer than the "
                         f"{SCHEMA_VERSION} this version reads; reproduce it with the sglang-vpp that wrote it")
    old = [rank for rank, schema in schemas.items() if schema < SCHEMA_VERSION]
    if old:
        raise TraceError(f"{str(trace_dir)!r}: ranks {old} were traced before arrivals and poll times were "
                         f"recorded (schema {SCHEMA_VERSION}); check --trace replays them, --reproduce needs a "
                         "trace from this version's --vpp-trace")
    # Chunk cuts, auto sizes and decode-slot joins do not depend on timing; the replay run first checks them.
    try:
        check_timing_records(ranks)
    except TraceError as exc:
        raise TraceError(f"{str(trace_dir)!r}: unreadable timing records: {exc}") from None
    try:
        expected = {rank: (data["records"], [d for d in data.get("decisions") or []
                                             if d["kind"] not in (CHUNK, DECODE, RESIZE)])
                    for rank, data in ranks.items()}
        model = ServerModel(ranks[0]["controller"], builds_from_trace(ranks[0]),
                            timings if timings is not None else MeasuredTimings(ranks), expected)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise TraceError(f"{str(trace_dir)!r}: unreadable timing records ({exc!r})") from None
    difference = model.run()
    compared = {state.rank: len(state.computes) + len(state.decisions) for state in model.ranks}
    return ReproduceResult(str(ranks[0]["controller"]["mode"]), compared, difference)
