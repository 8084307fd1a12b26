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
every ``slots / P`` micro-batches. The other slots run prefill only. A request whose prefill ends
in one of those joins a decode slot (``join``): the one with the fewest running requests among
those that can take it now (the executor says which: a slot whose decode batch is in flight
cannot grow), ties to the lower slot; None when none can, and the request decodes where its
prefill ran until the executor asks again. The decision reads only its inputs, so every rank
that replays the same scheduling steps decides alike, and a trace replays it
(``DecodeGroups.join`` is recorded as ``decode`` records: ``sglang_vpp.trace_records``).

Prefill is not held back: a decode slot still runs prefill first when its scheduler has some
(stock PP's rule, so decode waits no longer than under stock PP for the same prefill), and the
prefill-only slots let prefill overlap in the deeper V.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DecodeGroups", "decode_groups"]


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
