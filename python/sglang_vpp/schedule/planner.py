"""The planner: turns requests into per-rank action streams as its executor reports completions.

Data flow: ``submit(RequestSpec)`` chunks the request (``Controller.next_chunk_size``, with the
config's chunker) and appends its chunks to the global chunk sequence; ``advance(until)`` takes
every decision possible at the executor's time with what has been reported and appends actions
to each rank's stream; the executor reports each action as it ends (``action_done``: this rank
finished its next action at this time; an ``async`` send once posted) and, if it sees the wire
(``sees_transfers``), each ``async`` hand-off's arrival (``transfer_done``). The planner has no
clock of its own: everything it emits is in flight until reported. Every rank that calls the
same methods in the same order gets the same streams, which is how SGLang-style replicated
schedulers stay in step without exchanging decisions. Executors: the event engine
(``engine.py``: the dry run, ``dry_run.py``, on the controller's estimate; ``auto``'s what-ifs;
the simulator) and the reference runtime (``runtime/control.py``: its ranks' real completions).

The planner is a driver of the ``Controller`` (``controller.py``): the controller decides
admission (in-flight limit, request barrier, packing), the order in which a rank runs its ready
stages, the chunk sizes and each hand-off's group and semantics; the planner supplies arrivals
and completion times, decides when blocking hand-offs pair up, and passes each decision to
``Lowering`` (``lowering.py``), which writes the per-rank actions:

- Every stage processes chunks in sequence order (request-major). Hence each communicator sees
  sends and receives in the same order on both ends, and a chunk's KV prefix on a stage is always
  built before the chunk needs it.
- Stage 0 offers a chunk to the controller once its request has arrived; a chunk leaves the
  controller's in-flight set when its last stage is reported done.
- With a token budget (``ControllerConfig.token_budget``), a chunk that stage 0 starts takes the
  following whole requests that have arrived into its forward while the controller lets them join
  (``Controller.joining_tokens``) and still admits the grown micro-batch; their chunks leave the
  sequence and ride in the lead's ``ChunkSpec.batch``. With ``partial_fill`` the last may join as
  a head, and its rest takes its place in the sequence.
- ``async`` policies post a send right after the compute that produced it and receive right
  before the compute that consumes it (``Lowering.compute``). ``blocking`` policies pair each
  hand-off on both ranks at the same moment (a rendezvous); when two neighbours hold outputs for
  each other, the fold-back (higher-stage) one goes first. Because both ends of every pair are
  emitted at one point of a single global order, blocking streams can always be executed without
  deadlock.

The consequences of a compute ending (the next stage's input ready, the request complete, a
blocking output offered) are applied by one method (``_produced``). A ``fork`` (the what-if an
``auto`` chunker scores) takes over the work in flight at its estimated ends and plans on from
the present on the engine; only a fork holds state dated ahead of its present.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from .chunking import Chunker
from .controller import Admission, Controller, MicroBatch
from .factory import ControllerConfig, build_controller
from .ir import Action, ActionKind, ChunkSpec, RequestSpec, link_key, send
from .lowering import Lowering
from .policies import CommSemantics

__all__ = ["CarriedSend", "Planner", "TimelineEntry"]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One compute as its executor reported it (start, end)."""

    rank: int
    stage_index: int
    request_index: int
    chunk_index: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class CarriedSend:
    """An ``async`` hand-off a fork takes over: sent before the fork, its receive not emitted."""

    send: Action
    time: float
    """Its arrival if ``arrived``, else when it was posted (its producer's end)."""
    arrived: bool


class Planner:
    """Online list scheduler; see the module docstring."""

    def __init__(
        self,
        config: ControllerConfig,
        on_complete: Callable[[int, float], list[RequestSpec]] | None = None,
        sees_transfers: bool = False,
    ) -> None:
        """``on_complete(request, t)``: the requests a completion sends (a closed loop).
        ``sees_transfers``: the executor also reports when each ``async`` hand-off has arrived
        (``transfer_done``), and the next stage waits for that report (the engine does); an
        executor that cannot see the wire leaves it off, and the consumer's receive waits."""
        self.config = config
        self.sees_transfers = sees_transfers
        self._on_complete = on_complete
        layout = config.layout
        self._num_ranks = layout.num_ranks
        self._num_stages = layout.num_stages
        self._stage_rank = [s.rank for s in layout.stages]
        self._rank_stages = [layout.stages_of(r) for r in range(layout.num_ranks)]
        self.controller = build_controller(config)
        self._blocking = self.controller.blocking
        self._lowering = Lowering(self.controller)
        self._actions = self._lowering.actions
        self._taken = [0] * self._num_ranks
        self.requests: list[RequestSpec] = []
        self.sequence: list[ChunkSpec] = []
        self.chunks: dict[tuple[int, int], ChunkSpec] = {}
        """The micro-batches of ``sequence`` by key (a batched forward under its lead's key)."""
        self._ready_at: list[list[float | None]] = [[] for _ in range(self._num_stages)]
        self._finish: list[list[float | None]] = [[] for _ in range(self._num_stages)]
        self._next_position = [0] * self._num_stages
        self._rank_free = [0.0] * self._num_ranks
        self._offer: list[tuple[int, int] | None] = [None] * self._num_ranks
        self._completions: list[tuple[float, int]] = []
        self._finishing: list[tuple[float, int, ChunkSpec]] = []
        """A fork's last chunks in flight, finishing at their estimated ends (``_finish_due``)."""
        self._stage_link = _stage_links(self.controller)
        self._link_free: dict[tuple[str, int, int], float] = {}
        self.request_finish: dict[int, float] = {}
        self.timeline: list[TimelineEntry] = []
        self._records_timeline = True
        self.now = 0.0
        self._estimated_until = 0.0
        """A fork: when the last of the work it took over in flight ends (``_finish_in_flight``);
        until then some of its state is dated ahead of its present."""
        self.carried_sends: list[CarriedSend] = []
        """A fork's ``async`` hand-offs sent before it and not received yet, with their arrival:
        the engine that runs the fork pairs the receives it emits with them."""
        # Keyed by (rank, step in its stream): how many of each rank's actions are reported done;
        # the sequence position of each unreported compute and blocking receive (what its report
        # completes) and when it started; the estimated end of each unreported compute and
        # blocking hand-off (what a fork assumes until reported).
        self._reported = [0] * self._num_ranks
        self._in_flight: dict[tuple[int, int], int] = {}
        self._started: dict[tuple[int, int], float] = {}
        self._estimated_end: dict[tuple[int, int], float] = {}
        # A planner that sees transfers: the position of each async hand-off in flight.
        self._in_transit: dict[tuple[int, tuple[int, int]], int] = {}
        self._last_micro_batch: tuple[ChunkSpec, MicroBatch] | None = None

    # ----------------------------------------------------------------- public API
    def submit(self, request: RequestSpec) -> int:
        """Chunk ``request`` and queue its chunks; returns its request index."""
        index = len(self.requests)
        self.requests.append(request)
        self._replace_slots(len(self.sequence), len(self.sequence), self._cut(index, 0, 0))
        return index

    def _replace_slots(self, start: int, stop: int, chunks: Sequence[ChunkSpec]) -> None:
        """Put ``chunks`` in the sequence's slots ``[start, stop)``, none of which has entered a
        stage: the chunk map and every stage's lists follow (the new slots not yet ready)."""
        for old in self.sequence[start:stop]:
            del self.chunks[old.key]
        self.sequence[start:stop] = chunks
        for chunk in chunks:
            self.chunks[chunk.key] = chunk
        for stage in range(self._num_stages):
            self._ready_at[stage][start:stop] = [None] * len(chunks)
            self._finish[stage][start:stop] = [None] * len(chunks)

    def _cut(self, request_index: int, start: int, chunk_index: int) -> list[ChunkSpec]:
        """Request ``request_index``'s chunks from token ``start`` on (numbered from
        ``chunk_index``), at the sizes the controller's chunker gives."""
        length = self.requests[request_index].length
        chunks = []
        while start < length:
            size = self.controller.next_chunk_size(start, length - start)
            chunks.append(ChunkSpec(request_index, chunk_index, start, size, start + size == length))
            start, chunk_index = start + size, chunk_index + 1
        return chunks

    def advance(self, until: float) -> None:
        """Take every decision possible at the executor's time ``until`` with what has been
        reported."""
        self.now = max(self.now, until)
        self._finish_due(self.now)
        self._settle(self.now)

    def rank_actions(self, rank: int) -> list[Action]:
        return self._actions[rank]

    def take_new_actions(self, rank: int) -> list[Action]:
        """Actions of ``rank`` planned since the previous call (for online executors)."""
        new = self._actions[rank][self._taken[rank] :]
        self._taken[rank] = len(self._actions[rank])
        return new

    def action_done(self, rank: int, t: float) -> None:
        """``rank`` finished its next unreported action (stream order) at ``t``; an ``async``
        send counts as finished once posted. A rank is free again once all its actions are
        reported."""
        step = self._reported[rank]
        if step >= len(self._actions[rank]):
            raise ValueError(f"rank {rank} reported action {step}, but only {len(self._actions[rank])} were emitted")
        # The planner's present is the latest report: a completion callback (a closed loop's
        # next request, ``auto`` sizing it) happens at the time of the completion.
        self.now = max(self.now, t)
        self._report(rank, t, finish_now=True)

    def _report(self, rank: int, t: float, finish_now: bool) -> None:
        """Apply ``rank``'s next action ending at ``t``; ``finish_now``: a request it completes is
        finished at once (a report at its time) rather than when the present reaches ``t`` (a
        fork's work in flight, ``_finish_in_flight``)."""
        step = self._reported[rank]
        action = self._actions[rank][step]
        self._reported[rank] = step + 1
        if self._reported[rank] == len(self._actions[rank]):
            # Free before the consequences run: a fork taken in a completion callback sees it so.
            self._rank_free[rank] = t
        key = (rank, step)
        self._estimated_end.pop(key, None)
        if key in self._in_flight:
            position = self._in_flight.pop(key)
            stage = action.stage_index
            if action.kind is ActionKind.COMPUTE:
                self._finish[stage][position] = t
                started = self._started.pop(key)
                if self._records_timeline:
                    self.timeline.append(TimelineEntry(rank, stage, action.request_index, action.chunk_index,
                                                       started, t))
                self._produced(rank, stage, position, t, finish_now)
            else:  # the receiving end of a blocking hand-off: the input is there
                self._ready_at[stage][position] = t

    def transfer_done(self, stage: int, key: tuple[int, int], t: float) -> None:
        """Planners that see transfers: ``stage``'s output for the micro-batch ``key`` has
        arrived at the next rank at ``t`` (``async`` hand-offs; others are ignored)."""
        if not self.sees_transfers:
            raise ValueError("transfer_done is for a planner built with sees_transfers=True")
        position = self._in_transit.pop((stage, key), None)
        if position is not None:
            self._ready_at[stage][position] = t
            link = self._stage_link[stage]
            self._link_free[link] = max(self._link_free.get(link, 0.0), t)

    def reported(self, rank: int) -> int:
        """How many of ``rank``'s actions are reported done."""
        return self._reported[rank]

    @property
    def settled(self) -> bool:
        """Every chunk submitted has run on every stage, and every action is reported."""
        if any(p < len(self.sequence) for p in self._next_position) or any(self._offer) or self._finishing:
            return False
        return all(self._reported[r] == len(self._actions[r]) for r in range(self._num_ranks))

    def chunk(self, position: int) -> ChunkSpec:
        return self.sequence[position]

    def fork(self, chunker: Chunker | None, token_budget: int | None,
             on_complete: Callable[[int, float], list[RequestSpec]] | None = None) -> Planner:
        """A copy that plans on from this state, with ``chunker`` and ``token_budget`` for what is
        submitted or batched from now on: the what-if an ``auto`` chunker scores
        (``auto_size.AutoSizer.choose_live``), run by ``dry_run.dry_run`` on the controller's
        estimate. Work in flight ends at its estimated end (``_finish_in_flight``); the fork's
        streams hold only what it emits from now on (``carried_sends``: the hand-offs on their
        way); it records no timeline; ``on_complete`` replaces the executor's callback."""
        twin = copy.copy(self)
        # Every list and dict of the plan's state is copied (one level into lists of lists), so
        # a field added to the planner moves on independently in the fork without being named
        # here; ``tests/schedule/test_auto_live.py`` checks that nothing mutable is shared.
        for name, value in vars(self).items():
            if isinstance(value, list):
                setattr(twin, name, [list(row) if isinstance(row, list) else row for row in value])
            elif isinstance(value, dict):
                setattr(twin, name, dict(value))
        # The estimate, the layout and the policy are shared read-only; the rest of the
        # controller's state (in flight, window) moves on independently.
        live = self.controller
        shared = {id(part): part for part in (live.cost, live.layout, live.policy) if part is not None}
        if live.chunker is not None:  # not copied: replaced below
            shared[id(live.chunker)] = chunker
        twin.controller = copy.deepcopy(live, shared)
        twin.controller.chunker = chunker
        twin.controller.token_budget = token_budget
        twin._on_complete = on_complete
        twin._blocking = twin.controller.blocking
        # Nobody reads a fork's timeline: it writes none.
        twin.timeline = []
        twin._records_timeline = False
        twin._finish_in_flight()
        twin.carried_sends = twin._sends_on_their_way()
        # The fork's streams start empty (every action before is reported).
        twin._lowering = Lowering(twin.controller)
        twin._actions = twin._lowering.actions
        twin._taken = [0] * self._num_ranks
        twin._reported = [0] * self._num_ranks
        twin.sees_transfers = True
        return twin

    def _finish_in_flight(self) -> None:
        """A fork's present: every unreported action ends at its estimated end (an ``async``
        receive or send with the rank's previous action), in time order, and a request it
        completes finishes when the present gets there (``_finish_due``); every ``async``
        hand-off on the wire is carried to the fork's engine (``_sends_on_their_way``)."""
        reports = []
        for rank in range(self._num_ranks):
            running = self.now
            for step in range(self._reported[rank], len(self._actions[rank])):
                running = max(running, self._estimated_end.get((rank, step), running))
                reports.append((running, rank, step))
        for t, rank, _ in sorted(reports):
            self._report(rank, t, finish_now=False)
        self._estimated_until = max((t for t, _, _ in reports), default=self.now)

    def _sends_on_their_way(self) -> list[CarriedSend]:
        """After ``_finish_in_flight``: every ``async`` hand-off whose producer has run and whose
        consumer has not (its receive is still to be emitted), in each link's order (the
        sequence's): arrived (reported by an executor that sees the wire), or posted when its
        producer ended and left for the fork's engine to time behind its link's last transfer
        (also every one of an executor that cannot see the wire: whether it has arrived is
        unknown)."""
        carried = []
        for stage in range(self._num_stages - 1):
            hand = self.controller.hand_off(stage)
            if hand is None or hand.semantics is not CommSemantics.ASYNC:
                continue
            for position in range(self._next_position[stage + 1], self._next_position[stage]):
                chunk = self.sequence[position]
                action = send(stage, chunk.request_index, chunk.chunk_index, hand.dst_rank, hand.group)
                arrival = self._ready_at[stage][position]
                assert arrival is not None, (stage, position)
                if self.sees_transfers and arrival < math.inf:
                    carried.append((position, stage, CarriedSend(action, arrival, arrived=True)))
                    continue
                produced = self._finish[stage][position]
                assert produced is not None, (stage, position)
                self._ready_at[stage][position] = math.inf
                self._in_transit[(stage, chunk.key)] = position
                carried.append((position, stage, CarriedSend(action, produced, arrived=False)))
        return [entry for _, _, entry in sorted(carried, key=lambda c: (c[0], c[1]))]

    def link_free_at(self, key: tuple[str, int, int]) -> float:
        """When the last ``async`` hand-off reported on link ``key`` (``ir.link_key``) arrived
        (0 if none): where the link of a fork's engine starts."""
        return self._link_free.get(key, 0.0)

    # ----------------------------------------------------------------- the event loop
    def _settle(self, now: float) -> None:
        acted = True
        while acted:
            acted = False
            for rank in range(self._num_ranks):
                if self._rank_free[rank] <= now and self._act(rank, now):
                    acted = True

    def next_event_time(self) -> float | None:
        """The next time after ``now`` that a decision is due which no report will announce: the
        next request's arrival and, in a fork, the estimated ends of the work it took over in
        flight (None: nothing due)."""
        now = self.now
        times = []
        position = self._next_position[0]
        if position < len(self.sequence):
            arrival = self.requests[self.sequence[position].request_index].arrival
            if arrival > now:
                times.append(arrival)
        if now < self._estimated_until:
            times += [t for t in self._rank_free if now < t < math.inf]
            times += [t for t, _ in self._completions if t > now]
            times += [t for t, _, _ in self._finishing if t > now]
            for stage in range(1, self._num_stages):
                position = self._next_position[stage]
                if position < len(self.sequence):
                    ready = self._ready_at[stage - 1][position]
                    if ready is not None and now < ready < math.inf:
                        times.append(ready)
        return min(times) if times else None

    def _act(self, rank: int, now: float) -> bool:
        if self._blocking:
            if self._offer[rank] is not None:
                return self._try_handoff(rank, now)
            for peer in (rank - 1, rank + 1):
                offer = self._offer[peer] if 0 <= peer < self._num_ranks else None
                if offer is not None and self._consumer_rank(offer[0]) == rank:
                    if self._rank_free[peer] <= now:
                        self._handoff(peer, rank, offer, now)
                        return True
        candidates = []
        for stage in self._rank_stages[rank]:
            candidate = self._candidate(stage, now)
            if candidate is not None:
                candidates.append(candidate)
        if not candidates:
            return False
        stage, position = candidates[0] if len(candidates) == 1 else self.controller.pick(rank, candidates)
        self._run(rank, stage, position, now)
        return True

    def _candidate(self, stage: int, now: float) -> tuple[int, int] | None:
        position = self._next_position[stage]
        if position >= len(self.sequence):
            return None
        if stage == 0:
            return (stage, position) if self._admissible(position, now) else None
        ready = self._ready_at[stage - 1][position]
        return (stage, position) if ready is not None and ready <= now else None

    def _admissible(self, position: int, now: float) -> bool:
        chunk = self.sequence[position]
        if self.requests[chunk.request_index].arrival > now:
            return False
        while self._completions and self._completions[0][0] <= now:
            self.controller.on_left(heapq.heappop(self._completions)[1])
        return self.controller.admission(self._micro_batch(position)) is not Admission.NO

    def _micro_batch(self, position: int) -> MicroBatch:
        chunk = self.sequence[position]
        # Stage 0's head is asked about at every settle until admitted: build it once.
        last = self._last_micro_batch
        if last is not None and last[0] is chunk and last[1].seq == position:
            return last[1]
        micro_batch = MicroBatch(position, frozenset(part.request_index for part in chunk.parts), chunk.start,
                                 chunk.total_tokens, chunk.ends_request, chunk_index=chunk.chunk_index,
                                 batch=chunk.batch)
        self._last_micro_batch = (chunk, micro_batch)
        return micro_batch

    def _form_batch(self, position: int, now: float) -> None:
        """Grow the micro-batch at ``position`` (about to enter stage 0) by the requests after it
        that have arrived, while the controller lets them join and admits the result: whole, or
        the last one's head (``Controller.joining_tokens``), whose rest, cut anew from the head's
        end, then takes that request's place in the sequence, next after the batch."""
        if self.controller.token_budget is None:
            return
        batch = self._micro_batch(position)
        end = position + 1
        split = False
        while end < len(self.sequence):
            chunk = self.sequence[end]
            if self.requests[chunk.request_index].arrival > now:
                break
            candidate = self._micro_batch(end)
            tokens = self.controller.joining_tokens(batch, candidate)
            if tokens == 0:
                break
            part = chunk if tokens == chunk.num_tokens else dataclasses.replace(chunk, num_tokens=tokens, is_last=False)
            grown = MicroBatch(position, batch.requests | candidate.requests, batch.start,
                               batch.num_tokens + tokens, part.is_last, chunk_index=batch.chunk_index,
                               batch=batch.batch + (part,))
            if self.controller.admission(grown) is Admission.NO:
                break
            batch = grown
            if not part.is_last:
                split = True
                break
            end += 1
        if not batch.batch:
            return
        # The joined chunks have not entered any stage (every stage runs the sequence in order).
        lead = self.sequence[position] = dataclasses.replace(self.sequence[position], batch=batch.batch)
        self.chunks[lead.key] = lead
        if split:  # the split request's slots in the sequence (and their lists) are its rest's
            self._recut_rest(end, batch.batch[-1])
        self._replace_slots(position + 1, end, ())  # the joined ones ride in the lead's forward

    def _recut_rest(self, position: int, head: ChunkSpec) -> None:
        """Replace the chunks of ``head``'s request from ``position`` on (none has entered a stage)
        by its rest, cut by the controller's chunker from the head's end (``_cut``): the sizes the
        chunker gives at the new prefixes, as SGLang sizes its chunked request's next chunks
        (fixed chunks leave a short prompt's rest whole; a DCPP curve may cut it in two)."""
        request = head.request_index
        stop = position
        while stop < len(self.sequence) and self.sequence[stop].request_index == request:
            stop += 1
        self._replace_slots(position, stop, self._cut(request, head.start + head.num_tokens, head.chunk_index + 1))

    # ----------------------------------------------------------------- emitting work
    def _run(self, rank: int, stage: int, position: int, now: float) -> None:
        if stage == 0:
            self._form_batch(position, now)
        chunk = self.sequence[position]
        if stage == 0:
            micro_batch = self._micro_batch(position)
            self.controller.on_admitted(micro_batch, self.controller.admission(micro_batch))
        self._lowering.compute(rank, stage, chunk)
        self._next_position[stage] = position + 1
        # In flight until the executor reports it; the estimate is what a fork assumes.
        step = self._step_of(rank, ActionKind.COMPUTE)
        self._in_flight[(rank, step)] = position
        self._started[(rank, step)] = now
        # The rank is free (every action reported) whenever it is given work.
        self._estimated_end[(rank, step)] = now + self.config.cost.stage_cost(self.config.layout.stages[stage], chunk)
        self._rank_free[rank] = math.inf

    def _produced(self, rank: int, stage: int, position: int, end: float, finish_now: bool) -> None:
        """``stage`` of the chunk at ``position`` ended on ``rank`` at ``end``: the next stage's
        input, a blocking offer, or the micro-batch's completion follows (at once with
        ``finish_now``, else when the clock reaches ``end``)."""
        chunk = self.sequence[position]
        consumer = self._consumer_rank(stage)
        if consumer is None:
            heapq.heappush(self._completions, (end, position))
            if chunk.is_last:
                if finish_now:
                    self._finish_requests(chunk, end)
                else:
                    # Finished when the clock gets there, as an executor's report would say.
                    heapq.heappush(self._finishing, (end, position, chunk))
        elif consumer == rank:  # [Note: fold point has no comm]
            self._ready_at[stage][position] = end
        elif self._blocking:
            self._offer[rank] = (stage, position)
        elif self.sees_transfers:
            # Ready once the executor says it arrived.
            self._ready_at[stage][position] = math.inf
            self._in_transit[(stage, chunk.key)] = position
        else:
            # An executor that cannot see the wire lets the consumer's receive wait for it.
            self._ready_at[stage][position] = end

    def _step_of(self, rank: int, kind: ActionKind) -> int:
        """Index in ``rank``'s stream of the last action of ``kind`` just lowered."""
        actions = self._actions[rank]
        step = len(actions) - 1
        while actions[step].kind is not kind:
            step -= 1
        return step

    def _try_handoff(self, rank: int, now: float) -> bool:
        offer = self._offer[rank]
        assert offer is not None
        peer = self._consumer_rank(offer[0])
        assert peer is not None
        if self._rank_free[peer] > now:
            return False
        peer_offer = self._offer[peer]
        if peer_offer is None:
            self._handoff(rank, peer, offer, now)
            return True
        if self._consumer_rank(peer_offer[0]) != rank:
            return False  # the peer waits on its other neighbour; we wait on the peer
        # Head to head: the fold-back (higher-stage) hand-off goes first; the other rank posts
        # its receive before its own send.
        if peer_offer[0] > offer[0]:
            self._handoff(peer, rank, peer_offer, now)
        else:
            self._handoff(rank, peer, offer, now)
        return True

    def _handoff(self, src: int, dst: int, offer: tuple[int, int], now: float) -> None:
        stage, position = offer
        chunk = self.sequence[position]
        self._lowering.handoff(stage, chunk)
        self._offer[src] = None
        # Both ranks are free (every action reported) when a hand-off pairs them.
        end = now + self.config.cost.transfer_cost(self.config.layout.stages[stage], chunk)
        receive = (dst, self._step_of(dst, ActionKind.RECV))
        self._in_flight[receive] = position
        self._estimated_end[receive] = self._estimated_end[(src, self._step_of(src, ActionKind.SEND))] = end
        self._rank_free[src] = self._rank_free[dst] = math.inf
        self._ready_at[stage][position] = math.inf

    def _finish_due(self, now: float) -> None:
        while self._finishing and self._finishing[0][0] <= now:
            end, _, chunk = heapq.heappop(self._finishing)
            self._finish_requests(chunk, end)

    def _finish_requests(self, chunk: ChunkSpec, end: float) -> None:
        """The requests whose last chunk ``chunk`` carried are complete at ``end``. Every part is
        finished before any completion sends more work: a fork taken in a callback (``fork``)
        then sees the whole micro-batch done."""
        finished = chunk.completed_requests
        for request_index in finished:
            self.request_finish[request_index] = end
        for request_index in finished:
            self._complete_request(request_index, end)

    def _complete_request(self, request_index: int, end: float) -> None:
        if self._on_complete is not None:
            for new in self._on_complete(request_index, end):
                self.submit(new)

    # ----------------------------------------------------------------- helpers
    def _consumer_rank(self, stage: int) -> int | None:
        return None if stage == self._num_stages - 1 else self._stage_rank[stage + 1]

    def stuck_state(self) -> str:
        """Where the planning stopped (for an error)."""
        return (
            f"planner stopped with work left: next positions {self._next_position}, "
            f"sequence length {len(self.sequence)}, offers {self._offer}, rank free {self._rank_free}, now {self.now}"
        )


def _stage_links(controller: Controller) -> list[tuple[str, int, int] | None]:
    """Each stage's hand-off communicator (None: no hand-off): where the planner notes when a
    link's last reported hand-off arrived (``link_free_at``)."""
    links = []
    for stage in range(controller.layout.num_stages):
        hand = controller.hand_off(stage)
        links.append(None if hand is None else link_key(hand.group, hand.src_rank, hand.dst_rank))
    return links

