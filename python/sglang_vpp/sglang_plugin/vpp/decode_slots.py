"""Executes the controller's decode grouping on SGLang's per-slot running batches.

SGLang's PP loop keeps one running batch per micro-batch slot, and a request decodes in the
slot whose batch ran its last prefill chunk: ``get_next_batch_to_run`` merges the slot's last
(extend) batch into the slot's running batch. The controller (``schedule/decode_groups.py``)
keeps decode in stock PP's count of slots; here, when a prefill ends in a prefill-only slot, its
requests move to the decode slot the controller names, by the same two SGLang calls that merge
them in the stock loop (``ScheduleBatch.filter_batch`` with the chunked request excluded, then
``merge_batch``). A decode slot can take them only while its running batch is not in flight
(its decode batch is that same object until its result is processed); when none can, they stay
and are moved at the slot's next turn, before SGLang schedules it (or, if still none can, they
decode there once, as in the stock loop).

Every rank replays the same "sched" and "result" events in the same order on equal schedulers,
so every rank moves the same requests to the same slot. Requests always sit in one of
SGLang's ``running_mbs`` / ``mbs``, which its abort and idle checks read.
"""

from __future__ import annotations

from typing import Any, Callable

from sglang_vpp.schedule import Controller

__all__ = ["DecodeRegrouper"]


class DecodeRegrouper:
    """One per rank; ``Replica`` calls it around every scheduling step and result."""

    def __init__(self, scheduler: Any, controller: Controller, record: Callable[..., None]) -> None:
        self.s = scheduler
        self.controller = controller
        self.groups = controller.decode
        self.record = record
        """Writes a ``decode`` decision record (``trace_records.DECODE``)."""
        self.in_flight: set[int] = set()
        """Slots whose batch is scheduled and its result not yet processed."""
        self.num_moved = 0

    def before_schedule(self, slot: int) -> None:
        if not self.groups.is_decode_slot(slot):
            self._move_from(slot)

    def on_scheduled(self, slot: int, batch: Any) -> None:
        if batch is not None:
            self.in_flight.add(slot)

    def on_result(self, slot: int) -> None:
        self.in_flight.discard(slot)
        if not self.groups.is_decode_slot(slot):
            self._move_from(slot)

    def _move_from(self, slot: int) -> None:
        s = self.s
        last, running = s.last_mbs[slot], s.running_mbs[slot]
        ended = last is not None and last.forward_mode.is_extend() and last is not running
        # What SGLang's get_next_batch_to_run would merge: the prefill's unfinished requests but
        # a chunked one, whose next chunk comes in a later prefill batch.
        exclude = [req for req in (s.chunked_req, last.chunked_req if ended else None) if req is not None]
        moving = [req for req in last.reqs if not req.finished() and req not in exclude] if ended else []
        if not moving and running.is_empty():
            return
        open_slots = {d: s.running_mbs[d].batch_size() for d in self.groups.decode_slots if d not in self.in_flight}
        target = self.controller.decode_join(open_slots)
        self.record(from_slot=slot, running=[[d, n] for d, n in sorted(open_slots.items())], chosen=target)
        if target is None:
            return
        if ended:
            last.filter_batch(reqs_to_exclude=exclude)
            self._merge_into(target, last)
            s.last_mbs[slot] = None
        if not running.is_empty():
            self._merge_into(target, running)
            s.running_mbs[slot] = type(running)(reqs=[], batch_is_full=False)
        s.running_batch = s.running_mbs[slot]
        self.num_moved += 1

    def _merge_into(self, target: int, batch: Any) -> None:
        s = self.s
        if batch.is_empty():
            return
        into = s.running_mbs[target]
        if into.is_empty():
            s.running_mbs[target] = batch
        else:
            into.merge_batch(batch)
        s.running_mbs[target].batch_is_full = False
