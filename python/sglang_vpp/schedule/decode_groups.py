"""Decode grouping: which micro-batch slots carry running (decoding) requests, and which of
them a request joins when its prefill ends.

An executor that keeps one running batch per micro-batch slot (SGLang's PP loop: a request
decodes in the slot whose batch finished its prefill) spreads decode over every slot it opens.
Stock PP opens P slots; a fold-back mode 2P-1 (twice that with packing, ``ControllerLimits``).
Every decode micro-batch costs each rank one forward per stage it owns (two under fold-back),
whatever its size, so spreading the same running requests over more slots costs more forwards
per generated token, and each request waits for its slot's turn in a longer cycle.

Rule: the running requests form as many decode micro-batches as stock PP's (``num_ranks``
slots, ``DecodeGroups.decode_slots``), spaced evenly in the slot cycle so each comes round
every ``slots / P`` micro-batches. The other slots run prefill only. ``DecodeGroups.move``
decides, at every turn of a slot (before the executor schedules it) and on each of its results,
what happens to the requests there:

- a decode slot keeps its own requests: nothing to decide;
- a prefill-only slot with no request whose prefill ended and no running request: nothing;
- otherwise they move to a decode slot (``join``): the one with the fewest running requests
  among those that can take them now (a slot whose decode batch is in flight cannot grow: the
  executor names those), ties to the lower slot;
- when none can (every decode slot in flight), they are HELD (``chosen`` None): they stay
  where they are but do not decode there (the slot's turns run prefill only), since decoding
  in place would add a decode micro-batch beyond stock PP's count. A decode slot opens only at
  its result, so at every turn and result of any slot the held slots ask again
  (``DecodeGroups.joins``, in slot order) and join the first decode slot that opens: a hold
  lasts at most until the next result of a decode slot, and nothing is held once nothing is in
  flight, so no request waits past an idle pipeline.

The running requests thus form at most P decode micro-batches per cycle, never more. A held
request waits for the decode slot's next turn instead of decoding at its own slot's, and the
decode micro-batch it joins is larger (fewer forwards per generated token).

The decision reads only its inputs, so every rank that replays the same scheduling steps
decides alike, and a trace replays it (``DecodeMove.record`` is a ``decode`` record of
``sglang_vpp.trace_records``).

Prefill is not held back: a decode slot still runs prefill first when its scheduler has some
(stock PP's rule, so decode waits no longer than under stock PP for the same prefill), and the
prefill-only slots let prefill overlap in the deeper V.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

__all__ = ["DecodeGroups", "DecodeMove", "decode_groups"]


@dataclass(frozen=True, slots=True)
class DecodeMove:
    """A decision on the requests of a prefill-only slot: move them to ``chosen``, or hold them
    (``chosen`` None: no decode slot could take them; they do not decode until they join)."""

    from_slot: int
    running: tuple[tuple[int, int], ...]
    """``(slot, running requests)`` of each decode slot that could take them, by slot."""
    chosen: int | None

    @property
    def holds(self) -> bool:
        return self.chosen is None

    def record(self) -> dict:
        """The fields of a ``decode`` trace record."""
        return {"from_slot": self.from_slot, "running": [[slot, count] for slot, count in self.running],
                "chosen": self.chosen}


@dataclass(frozen=True, slots=True)
class DecodeGroups:
    num_slots: int
    """Micro-batch slots the executor opens (``ControllerLimits.slots``)."""
    decode_slots: tuple[int, ...]
    """Slots that keep running requests, in cycle order."""

    def __post_init__(self) -> None:
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if not self.decode_slots or any(not 0 <= s < self.num_slots for s in self.decode_slots):
            raise ValueError(f"decode slots {self.decode_slots} must be a non-empty subset of "
                             f"0..{self.num_slots - 1}")

    def is_decode_slot(self, slot: int) -> bool:
        return slot in self.decode_slots

    @property
    def regroups(self) -> bool:
        """Whether any slot runs prefill only (else the executor's own grouping stands)."""
        return len(self.decode_slots) < self.num_slots

    def join(self, running: Mapping[int, int]) -> int | None:
        """The decode slot a request whose prefill just ended joins. ``running``: for each decode
        slot that can take requests now, its running requests (slots missing cannot)."""
        unknown = set(running) - set(self.decode_slots)
        if unknown:
            raise ValueError(f"slots {sorted(unknown)} are not decode slots {self.decode_slots}")
        if not running:
            return None
        return min(running, key=lambda slot: (running[slot], slot))

    def move(self, slot: int, *, prefill_ended: bool, running: Mapping[int, int],
             in_flight: Collection[int]) -> DecodeMove | None:
        """What happens to the requests of ``slot`` at one of its turns or results (module doc).

        ``prefill_ended``: requests whose prefill ended in ``slot`` wait to decode (the chunked
        request, whose next chunk comes later, and finished ones do not count). ``running``:
        running requests of each slot (missing: none), held ones included. ``in_flight``: slots
        whose batch is scheduled and its result not yet processed. None: nothing to decide."""
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot {slot} is not one of 0..{self.num_slots - 1}")
        if self.is_decode_slot(slot) or not (prefill_ended or running.get(slot, 0) > 0):
            return None
        open_slots = {d: running.get(d, 0) for d in self.decode_slots if d not in in_flight}
        return DecodeMove(slot, tuple(sorted(open_slots.items())), self.join(open_slots))

    def joins(self, held: Collection[int], running: Mapping[int, int],
              in_flight: Collection[int]) -> list[DecodeMove]:
        """The held slots that join a decode slot now, in slot order, each counting the requests
        joined before it (``running`` includes the held slots' own requests). Slots missing
        stay held: no decode slot is open, and the next turn or result asks again."""
        counts = dict(running)
        moves = []
        for slot in sorted(held):
            if self.is_decode_slot(slot):
                raise ValueError(f"slot {slot} is a decode slot {self.decode_slots}: it holds nothing")
            move = self.move(slot, prefill_ended=True, running=counts, in_flight=in_flight)
            if move.holds:
                break  # the same open slots for every held slot: none can join
            counts[move.chosen] = counts.get(move.chosen, 0) + counts.pop(slot, 0)
            moves.append(move)
        return moves


def decode_groups(num_slots: int, num_ranks: int, decodes: bool = True) -> DecodeGroups:
    """Stock PP's count of decode micro-batches (``num_ranks``, at most ``num_slots``), evenly
    spaced in a cycle of ``num_slots`` slots (slot ``i * num_slots // num_ranks``). A server that
    does not decode (the prefill side of a prefill-decode split hands every request on after its
    first token) keeps every slot as it is: no request is moved, so none can be stranded in a
    slot whose running batch that server never schedules."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    count = min(num_ranks, num_slots) if decodes else num_slots
    return DecodeGroups(num_slots, tuple(i * num_slots // count for i in range(count)))
