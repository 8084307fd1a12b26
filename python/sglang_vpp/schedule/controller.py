"""The online controller: the one place where admission, packing and per-rank order are decided.

Every executor asks the same object the same questions: the planner (driven by the event
engine: the dry run and the simulator; or by the reference runtime) and the SGLang loops (leader and followers).

- ``admission(mb)``: may micro-batch ``mb`` enter stage 0 now? ``NO``, ``YES`` or ``PACKED``.
- ``on_admitted(mb, decision)`` / ``on_left(seq)``: what entered stage 0 and what left the last
  stage, in the order the executor saw it.
- ``pick(rank, ready)``: which of a rank's ready ``(stage, seq)`` items runs first.
- ``next_chunk_size(prefix_len, remaining)``: the size of a request's next chunk (the chunker the
  controller was built with: fixed, tapered, the DCPP curve or ``auto``; ``resize(lengths)``
  and ``resize_live(planner, arriving)`` let an ``auto`` chunker pick the size and token budget
  for the prompts waiting, the second from a running planner's state).
- ``hand_off(stage)``: the group and the communication semantics of the hand-off of ``stage``'s
  output to the next stage (None when both stages share a rank, or for the last stage).
- ``decode``: which micro-batch slots keep running requests (as many as stock PP's);
  ``decode_move(slot, ...)``, at each turn and result of a slot, whether its requests move to a
  decode slot and to which, or are held; ``decode_joins`` which held slots join one now
  (``decode_groups.py``).

Decisions depend only on the order of these calls and on the estimated costs of the micro-batches,
never on a clock, so a recorded sequence of calls replays exactly (``check --trace``).

Rules (the meaning of each mode, also in docs/method.md):

- In-flight limit: at most ``limits.in_flight`` micro-batches between entering stage 0 and leaving
  the last stage (P for the contiguous layout, 2P-1 for fold-back; twice that with the policy's
  ``deep_window``). Packed micro-batches do not count against it. The deep window opens only
  while the prefill micro-batches in flight differ in estimated stage-0 cost by more than
  ``DEEP_WINDOW_SPREAD`` (``deep_window_open``): with equal micro-batches 2P-1 already keep
  every rank busy, and each one more only waits in a queue (a batch of short prompts finishes
  later, at the same throughput).
- Request barrier (policies with ``request_barrier``): prefill micro-batches form *groups*; a
  micro-batch that shares a request with the newest admitted prefill micro-batch continues its
  group, any other starts the next one. A micro-batch of a later group enters only after every
  prefill micro-batch of earlier groups left the last stage (one V at a time). Decode
  micro-batches are outside the barrier and only obey the in-flight limit.
- Packing (``pack``): while the oldest in-flight group drains (its last micro-batch admitted),
  micro-batches of the next group may enter as ``PACKED`` while their estimated stage-0 cost fits
  the window's budget, at most ``limits.pack_cap`` (2P-1, the slots SGLang reserves for them) per
  window. The budget, fixed when the window opens, follows the balanced steady state of method
  section 3.2: the draining group's last micro-batch C_n spends the estimated time of stages
  1 .. 2P-2 (1 .. 2P-3 with a fused fold, the same layers) away from rank 0, and during it rank 0 still owes the last stage of the group's
  in-flight micro-batches C_{n-2P+3} .. C_{n-1} (rank 0 pairs stage 0 of C_n with the last stage
  of C_{n-2P+2}). For P = 2 and tau_k = (k+1) t this is the method's (N + 1) t.
- Batching (``token_budget``, SGLang's chunked-prefill size): a prefill micro-batch that ends its
  request may take further whole requests into the same forward while their tokens fit the budget
  (``joining_tokens``), as SGLang's prefill adder fills a batch; a request that does not fit whole
  waits for the next micro-batch, or, with ``partial_fill``, starts in the budget left over (a
  head of its prompt) and runs its rest, cut from the head's end, next, first in the next
  micro-batch, as SGLang's adder truncates the request that overflows. A batch with a head does not end its
  requests (the head's continues), so it takes nothing more and the rest joins its group. The
  batch is one micro-batch for every rule above.
- Hand-off: ``blocking`` or ``async`` as the policy says; the group is ``pp`` with one group,
  else ``fwd`` (r -> r+1) or ``bwd`` (r+1 -> r) (``hand_off_group``).
- Order: ``OLDEST_FIRST`` runs the oldest micro-batch first (ties: the higher stage);
  ``FEED_PEER_FIRST`` first runs a stage whose output another rank waits for, then the oldest;
  ``FEED_PEER_UNTIL_FULL`` is ``FEED_PEER_FIRST`` except on the rank of stage 0 once the V is
  full (``full_pipeline``: at least the layout's ``default_in_flight_limit`` in flight), where it
  is ``OLDEST_FIRST``: every rank then has work queued, and finishing the oldest micro-batch
  completes its requests sooner and frees its slot. Elsewhere the two orders agree (a rank's
  fold-back item is always older than its forward one, and both feed a peer), so only rank 0,
  which sees every admission and departure in every executor, reads the in-flight count.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from .chunking import Chunker, check_chunk_size
from .cost import StageCostModel
from .decode_groups import DecodeGroups, DecodeMove, decode_groups
from .ir import GROUP_BACKWARD, GROUP_FORWARD, GROUP_SINGLE, ChunkSpec
from .layout import Layout, LayoutKind
from .policies import CommSemantics, PolicySpec, Priority

if TYPE_CHECKING:  # auto_size builds controllers: importing it here would be circular
    from .auto_size import AutoChoice

__all__ = ["Admission", "MicroBatch", "ControllerLimits", "Controller", "HandOff", "DEEP_WINDOW_SPREAD",
           "default_in_flight_limit", "hand_off_group", "hand_off_groups"]

DEEP_WINDOW_SPREAD = 0.1
"""A ``deep_window`` policy admits past 2P-1 micro-batches only while the largest estimated
stage-0 cost in flight exceeds the smallest by more than this fraction. Equal batches of short
prompts cost exactly the same; mixed traffic spreads by factors (a 100K-prefix chunk beside a
batch of short prompts), so any value well between the two separates them; 10 % (chosen, not
fitted) also counts a partial batch among full ones as unequal. Its effect on the 910C sweep:
docs/auto-chunk.md, "The window"."""


class Admission(StrEnum):
    NO = "no"
    YES = "yes"
    PACKED = "packed"


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """What the controller needs to know about one micro-batch (SGLang decides its contents)."""

    seq: int
    """Admission order, from 0."""
    requests: frozenset[Hashable]
    """Requests whose tokens the micro-batch carries."""
    start: int
    """KV prefix of the chunk (the longest when several requests share the micro-batch)."""
    num_tokens: int
    """Tokens of the whole forward (every request's in a batch)."""
    ends_request: bool
    """Every request it carries ends its prefill here (False: one continues, e.g. a head batched
    behind the lead); for decode, nothing to drain."""
    is_prefill: bool = True
    chunk_index: int = 0
    """Index of the chunk in its request, for cost models that read it (the planner's synthetic
    ones); models of real hardware read ``start`` and ``num_tokens`` only."""
    batch: tuple[ChunkSpec, ...] = ()
    """Requests batched behind the first one, when the planner knows them (``ChunkSpec.batch``);
    their tokens are part of ``num_tokens``."""

    def chunk(self) -> ChunkSpec:
        lead = self.num_tokens - sum(part.num_tokens for part in self.batch)
        return ChunkSpec(request_index=0, chunk_index=self.chunk_index, start=self.start,
                         num_tokens=max(1, lead), is_last=self.ends_request, batch=self.batch)


@dataclass(frozen=True, slots=True)
class ControllerLimits:
    in_flight: int
    pack_cap: int

    @property
    def slots(self) -> int:
        """Micro-batches that can be between stage 0 and the last stage at once."""
        return self.in_flight + self.pack_cap


def default_in_flight_limit(layout: Layout, policy: PolicySpec | None = None) -> int:
    """P for the contiguous layout (SGLang's micro-batch count); 2P-1 for fold-back (rank r pairs
    chunk k+d with chunk k-d, d = P-1-r, so 2P-1 chunks overlap in steady state), with either
    fold: fusing the fold rank's two stages changes neither the pairing on the other ranks nor
    any rank's work per micro-batch ([Note: fused fold]); twice that for a ``policy`` with
    ``deep_window``."""
    p = layout.num_ranks
    full = p if layout.kind is LayoutKind.CONTIGUOUS else 2 * p - 1
    return 2 * full if policy is not None and policy.deep_window else full


@dataclass(frozen=True, slots=True)
class HandOff:
    """How the output of one stage reaches the rank of the next stage."""

    src_rank: int
    dst_rank: int
    group: str
    semantics: CommSemantics


def hand_off_group(src_rank: int, dst_rank: int, num_groups: int) -> str:
    """The group of a hand-off from ``src_rank`` to ``dst_rank`` with ``num_groups`` groups per link."""
    if num_groups == 1:
        return GROUP_SINGLE
    return GROUP_FORWARD if dst_rank > src_rank else GROUP_BACKWARD


def hand_off_groups(num_groups: int) -> tuple[str, ...]:
    """Every group a pipeline with ``num_groups`` groups per link uses."""
    return (GROUP_SINGLE,) if num_groups == 1 else (GROUP_FORWARD, GROUP_BACKWARD)


@dataclass(slots=True)
class _InFlight:
    mb: MicroBatch
    group: int | None
    packed: bool
    stage0_cost: float
    """The estimate's stage-0 cost of ``mb``, which ``deep_window_open`` reads at every admission."""


@dataclass(slots=True)
class _Window:
    group: int
    budget: float
    packed: int = 0


class Controller:
    """Decides for one rank; every rank of a pipeline builds an equal one (see the module doc)."""

    def __init__(self, policy: PolicySpec, layout: Layout, cost: StageCostModel,
                 max_in_flight: int | None = None, token_budget: int | None = None, *,
                 chunker: Chunker | None = None, num_groups: int | None = None, decodes: bool = True,
                 partial_fill: bool = False) -> None:
        """``max_in_flight``: a fixed in-flight limit, also a packing mode's pack cap, with no deep
        window; None: ``default_in_flight_limit``. ``chunker``: None when the executor never asks
        ``next_chunk_size``. ``num_groups``: groups per link, None for the policy's (an executor
        whose transport needs one direction per link passes 2). ``decodes``: False on a server
        that only prefills (``decode_groups``). ``partial_fill``: a request that overflows the token
        budget starts in what is left of it (``joining_tokens``)."""
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if token_budget is not None:
            check_chunk_size(token_budget, "token_budget")  # the budget is SGLang's chunked-prefill size
        if num_groups not in (None, 1, 2):
            raise ValueError(f"num_groups must be 1 or 2, got {num_groups}")
        self.policy = policy
        self.layout = layout
        self._stages_of_rank = tuple(layout.stages_of(rank) for rank in range(layout.num_ranks))
        """``layout.stages_of`` per rank, which the server's loops read at every poll."""
        self.cost = cost
        self.chunker = chunker
        self.num_groups = num_groups if num_groups is not None else policy.num_groups
        in_flight = max_in_flight if max_in_flight is not None else default_in_flight_limit(layout, policy)
        self.limits = ControllerLimits(in_flight, in_flight if policy.pack else 0)
        self._shallow: int | None = (default_in_flight_limit(layout) if policy.deep_window and max_in_flight is None
                                     else None)
        """The in-flight limit while the deep window is closed; None: ``limits.in_flight`` always."""
        self.token_budget = token_budget
        """Tokens one prefill forward may carry when requests are batched; None: no batching."""
        self.partial_fill = partial_fill
        """A request that does not fit the budget whole starts in what is left (a head)."""
        self.auto_size: int | None = None
        """The size an ``auto`` chunker chose last (``resize``); None: none chosen yet."""
        self.decodes = decodes
        self.decode: DecodeGroups = decode_groups(self.limits.slots, layout.num_ranks, decodes)
        """The slots that keep running requests: stock PP's count, whatever the mode's slots."""
        self._in_flight: dict[int, _InFlight] = {}
        self._newest_prefill: _InFlight | None = None
        self._next_group = 0
        self._window: _Window | None = None
        self.num_packed = 0
        self.num_admitted = 0

    # ----------------------------------------------------------------- admission
    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def in_flight_seqs(self) -> frozenset[int]:
        return frozenset(self._in_flight)

    def admission(self, mb: MicroBatch) -> Admission:
        """The decision for ``mb`` in the current state; changes nothing."""
        if self.in_flight >= self.limits.slots:
            return Admission.NO
        within_limit = sum(not entry.packed for entry in self._in_flight.values()) < self.in_flight_limit
        if not mb.is_prefill or not self.policy.request_barrier:
            return Admission.YES if within_limit else Admission.NO
        group = self._group_of(mb)
        oldest = self._oldest_prefill_group()
        if oldest is None or group <= oldest:
            return Admission.YES if within_limit else Admission.NO
        # An earlier group still drains: only packing may start this micro-batch now.
        if not self.policy.pack or group != oldest + 1:
            return Admission.NO
        window = self._current_window(oldest)
        if window is None or window.packed >= self.limits.pack_cap:
            return Admission.NO
        return Admission.PACKED if self._stage_cost(0, mb) <= window.budget else Admission.NO

    def on_admitted(self, mb: MicroBatch, decision: Admission) -> None:
        assert decision is not Admission.NO, mb
        assert mb.seq not in self._in_flight, mb
        group = self._group_of(mb) if mb.is_prefill else None
        entry = _InFlight(mb, group, decision is Admission.PACKED, self._stage_cost(0, mb))
        if decision is Admission.PACKED:
            oldest = self._oldest_prefill_group()
            assert oldest is not None
            window = self._current_window(oldest)
            assert window is not None
            self._window = window
            window.budget -= entry.stage0_cost
            window.packed += 1
            self.num_packed += 1
        if mb.is_prefill:
            self._newest_prefill = entry
            if group == self._next_group:
                self._next_group += 1
        self._in_flight[mb.seq] = entry
        self.num_admitted += 1

    def state_key(self) -> tuple:
        """Everything ``admission`` reads besides the micro-batch: equal keys, equal answers."""
        in_flight = tuple(sorted((seq, e.group, e.packed) for seq, e in self._in_flight.items()))
        window = None if self._window is None else (self._window.group, self._window.budget, self._window.packed)
        newest = None if self._newest_prefill is None else (self._newest_prefill.mb.seq, self._newest_prefill.group,
                                                           tuple(sorted(map(str, self._newest_prefill.mb.requests))))
        return in_flight, window, newest, self._next_group, self._shallow is not None and self.deep_window_open

    @property
    def in_flight_limit(self) -> int:
        """Micro-batches, packed ones not counted, that may be in flight now: ``limits.in_flight``,
        or the shallow limit while a ``deep_window`` policy's window is closed (always with
        nothing but decode in flight)."""
        return self._shallow if self._shallow is not None and not self.deep_window_open else self.limits.in_flight

    @property
    def deep_window_open(self) -> bool:
        """The prefill micro-batches in flight differ in estimated stage-0 cost by more than
        ``DEEP_WINDOW_SPREAD``: only then does a ``deep_window`` policy admit past 2P-1."""
        costs = [e.stage0_cost for e in self._in_flight.values() if e.mb.is_prefill and not e.packed]
        return bool(costs) and max(costs) > (1.0 + DEEP_WINDOW_SPREAD) * min(costs)

    def on_left(self, seq: int) -> None:
        """Micro-batch ``seq`` finished the last stage."""
        entry = self._in_flight.pop(seq)
        if self._window is not None and entry.group == self._window.group:
            if not any(e.group == self._window.group for e in self._in_flight.values()):
                self._window = None

    def joining_tokens(self, batch: MicroBatch, candidate: MicroBatch) -> int:
        """How many tokens of ``candidate`` (a request's first chunk) ride in the forward of
        ``batch``, not yet admitted: a whole prompt while it fits ``token_budget``; with
        ``partial_fill`` otherwise the head that fills what is left, at most the first chunk (the
        caller cuts the rest anew from the head's end, as SGLang's adder runs its chunked request
        on from where the truncation left it); else 0. Only behind a micro-batch that ends its
        requests; the caller then asks ``admission`` about the grown batch."""
        if not (self.token_budget is not None and batch.is_prefill and candidate.is_prefill
                and batch.ends_request and candidate.chunk_index == 0
                and not candidate.requests & batch.requests):
            return 0
        room = self.token_budget - batch.num_tokens
        if candidate.ends_request and candidate.num_tokens <= room:
            return candidate.num_tokens
        return min(room, candidate.num_tokens) if self.partial_fill and room >= 1 else 0

    def decode_move(self, slot: int, *, prefill_ended: bool, running: Mapping[int, int],
                    in_flight: Collection[int]) -> DecodeMove | None:
        """Whether the requests of ``slot`` move to a decode slot now, and to which
        (``DecodeGroups.move``); None: nothing to decide; ``chosen`` None: they are held."""
        return self.decode.move(slot, prefill_ended=prefill_ended, running=running, in_flight=in_flight)

    def decode_joins(self, held: Collection[int], *, running: Mapping[int, int],
                     in_flight: Collection[int]) -> list[DecodeMove]:
        """Which held slots join a decode slot now, and where (``DecodeGroups.joins``)."""
        return self.decode.joins(held, running, in_flight)

    # ----------------------------------------------------------------- order
    def ready_items(self, rank: int, back_seq: int | None, forward_seq: int | None) -> list[tuple[int, int]]:
        """The ``(stage, seq)`` items ``rank`` lists as ready when micro-batch ``back_seq`` has
        come back up the V to it and ``forward_seq`` is there to go down (rank 0: the batch it
        holds for stage 0), in the order a server's loop lists them, records them (``pick``
        records) and replays them: the rank's later stage first."""
        stages = self._stages_of_rank[rank]
        ready = []
        if back_seq is not None:
            ready.append((stages[-1], back_seq))
        if forward_seq is not None:
            ready.append((stages[0], forward_seq))
        return ready

    def pick(self, rank: int, ready: Sequence[tuple[int, int]]) -> tuple[int, int]:
        """The ``(stage, seq)`` that ``rank`` runs first among ``ready``."""
        assert ready, "pick needs at least one ready item"
        priority = self.policy.priority
        if priority is Priority.FEED_PEER_UNTIL_FULL:
            full = rank == self.layout.stages[0].rank and self.full_pipeline
            priority = Priority.OLDEST_FIRST if full else Priority.FEED_PEER_FIRST
        if priority is Priority.FEED_PEER_FIRST:
            return min(ready, key=lambda item: (not self._feeds_peer(rank, item[0]), item[1], -item[0]))
        return min(ready, key=lambda item: (item[1], -item[0]))

    def pick_key(self, rank: int) -> tuple:
        """Everything ``pick`` on ``rank`` reads besides the ready items: equal keys, equal answers."""
        reads_state = self.policy.priority is Priority.FEED_PEER_UNTIL_FULL and rank == self.layout.stages[0].rank
        return (reads_state and self.full_pipeline,)

    @property
    def full_pipeline(self) -> bool:
        """At least as many micro-batches in flight as keep every rank busy in steady state."""
        return self.in_flight >= default_in_flight_limit(self.layout)

    # ----------------------------------------------------------------- chunks and hand-offs
    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        """Tokens of a request's next chunk, given the ``prefix_len`` tokens already chunked and
        the ``remaining`` ones."""
        assert self.chunker is not None, "this controller was built without a chunker"
        size = self.chunker.next_chunk_size(prefix_len, remaining)
        assert 1 <= size <= remaining, (size, prefix_len, remaining)
        return size

    def resize(self, lengths: Sequence[int]) -> int | None:
        """Tell an ``auto`` chunker (``auto_size.py``) the prompt lengths waiting and in flight
        (oldest first): it picks the chunk size of the next requests and, when this controller
        batches, the token budget. Returns the size; None when the chunker is not ``auto``."""
        resize = getattr(self.chunker, "resize", None)
        return None if resize is None else self._resized(resize(lengths).chunk_size)

    def resize_live(self, planner: object, arriving: Sequence[tuple[int, float]], to_come: int = 0) -> int | None:
        """``resize`` for requests (length, arrival) arriving at the running ``planner`` that
        holds this controller (``auto_size.LiveSituation``). None when the chunker is not
        ``auto``."""
        resize = getattr(self.chunker, "resize_live", None)
        return None if resize is None else self._resized(resize(planner, arriving, to_come).chunk_size)

    def auto_plan(self, lengths: Sequence[int]) -> AutoChoice | None:
        """The ``AutoChoice`` ``resize(lengths)`` would apply, without applying it: it reads no
        state that deciding writes, so an executor may plan off its loop and apply the answer
        with ``adopt_size``. None when the chunker is not ``auto``."""
        sizer = getattr(self.chunker, "sizer", None)
        return None if sizer is None else sizer.choose(lengths)

    def adopt_size(self, lengths: Sequence[int], size: int, tapered: bool = False) -> int | None:
        """Apply the cut an equal controller's ``resize(lengths)`` chose (size, and whether
        tapered: ``auto_tapered``): a pipeline's rank 0 decides, the other ranks apply its answer
        (``AutoChunker.adopt``). None when the chunker is not ``auto``."""
        adopt = getattr(self.chunker, "adopt", None)
        return None if adopt is None else self._resized(adopt(lengths, size, tapered).chunk_size)

    @property
    def auto_window(self) -> int | None:
        """How many prompt lengths of a situation an ``auto`` chunker plans (the rest it
        ignores); None when the chunker is not ``auto``."""
        return getattr(getattr(self.chunker, "sizer", None), "window", None)

    @property
    def auto_tapered(self) -> bool:
        """Whether the last ``auto`` choice cuts tapered at its size (False when none or not auto)."""
        return bool(getattr(getattr(self.chunker, "choice", None), "tapered", False))

    def _resized(self, size: int) -> int:
        """An ``auto`` size also sizes the batch budget: this controller's when it batches, and
        the executor's (``new_batch_budget``) when the executor forms the batches."""
        self.auto_size = size
        if self.token_budget is not None:
            self.token_budget = size
        return size

    def new_batch_budget(self, max_tokens: int) -> int:
        """Tokens of a prefill forward that starts with a new request, for an executor that
        forms its own batches (SGLang's prefill adder; ``max_tokens``: its cap). On a server
        that only prefills: the size ``auto`` chose for the last situation it was told
        (``resize``). Where the server also decodes, ``max_tokens``: the plan is of prefill only,
        and smaller batches of new requests spread their decode over more micro-batches, which
        made a served burst of short prompts slower (docs/auto-chunk.md, "Server")."""
        if self.auto_size is None or self.decodes:
            return max_tokens
        return min(self.auto_size, max_tokens)

    def batch_budget(self, prefix_len: int, remaining: int, max_tokens: int) -> int:
        """Token budget of the forward that continues a chunked request: its next chunk, or, when
        that chunk ends the request, a whole chunk's budget (at most ``max_tokens``), whose rest
        further requests may fill, as SGLang's prefill adder does."""
        cut = self.next_chunk_size(prefix_len, remaining)
        return cut if cut < remaining else self.next_chunk_size(prefix_len, max(1, max_tokens))

    @property
    def blocking(self) -> bool:
        return self.policy.comm_semantics is CommSemantics.BLOCKING

    def hand_off(self, stage: int) -> HandOff | None:
        """The hand-off of ``stage``'s output to stage ``stage + 1``; None for the last stage and
        where both stages share a rank ([Note: fold point has no comm])."""
        if stage == self.layout.num_stages - 1:
            return None
        src, dst = self.layout.stages[stage].rank, self.layout.stages[stage + 1].rank
        if src == dst:
            return None
        return HandOff(src, dst, hand_off_group(src, dst, self.num_groups), self.policy.comm_semantics)

    # ----------------------------------------------------------------- helpers
    def _group_of(self, mb: MicroBatch) -> int:
        newest = self._newest_prefill
        if newest is not None and newest.mb.requests & mb.requests:
            assert newest.group is not None
            return newest.group
        return self._next_group

    def _oldest_prefill_group(self) -> int | None:
        groups = [e.group for e in self._in_flight.values() if e.group is not None]
        return min(groups) if groups else None

    def _current_window(self, group: int) -> _Window | None:
        """The drain window of ``group``: open once its last micro-batch is admitted."""
        if self._window is not None and self._window.group == group:
            return self._window
        members = sorted((e.mb.seq, e) for e in self._in_flight.values() if e.group == group)
        last = members[-1][1]
        if not last.mb.ends_request or self._newest_group() != group:
            return None
        middle = sum(self._stage_cost(stage, last.mb) for stage in range(1, self.layout.last_stage))
        # Rank 0 pairs stage 0 of C_n with the last stage of C_{n-W+1}, W the fold-back window
        # (2P-1, fused fold or not: [Note: fused fold]).
        paired_with_rank0 = default_in_flight_limit(self.layout) - 1
        owed = sum(self._stage_cost(self.layout.last_stage, e.mb) for _, e in members[-paired_with_rank0:-1])
        return _Window(group, middle - owed)

    def _newest_group(self) -> int | None:
        return None if self._newest_prefill is None else self._newest_prefill.group

    def _feeds_peer(self, rank: int, stage: int) -> bool:
        if stage == self.layout.num_stages - 1:
            return False
        return self.layout.stages[stage + 1].rank != rank

    def _stage_cost(self, stage: int, mb: MicroBatch) -> float:
        return self.cost.stage_cost(self.layout.stages[stage], mb.chunk())
