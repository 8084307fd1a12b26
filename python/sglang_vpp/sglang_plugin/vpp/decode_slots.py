"""Executes the controller's decode grouping on SGLang's per-slot running batches.

SGLang's PP loop keeps one running batch per micro-batch slot, and a request decodes in the
slot whose batch ran its last prefill chunk: ``get_next_batch_to_run`` merges the slot's last
(extend) batch into the slot's running batch. At every turn of a slot (before SGLang schedules
it) and on each of its results, this asks the controller whether the slot's requests move and
where (``Controller.decode_move``, rules in ``schedule/decode_groups.py``), giving it what only
SGLang's state shows: whether a prefill ended there, each slot's running requests and which
slots' batches are in flight (a decode batch is the slot's running batch object until its
result is processed, so it cannot grow meanwhile). A move is done by the same two SGLang calls
that merge the requests in the stock loop (``ScheduleBatch.filter_batch`` with the chunked
request excluded, then ``merge_batch``), and recorded as the controller decided it.

A hold (no decode slot open) keeps the requests in the slot's running batch, where SGLang's
abort and idle checks see them (``running_mbs``), with the batch's ``is_prefill_only`` set:
``get_next_batch_to_run`` then schedules that slot's prefill as usual but never decodes its
running batch ("skip for prefill-only batches"). The ended prefill is merged into it here
(as SGLang would merge it, but a merge would clear the flag). At every turn and result of any
slot the held slots ask ``Controller.decode_joins``; joining restores the flag to what SGLang
derives from the requests. A hold is recorded once per slot and again when more requests join
it; every join is recorded.

A held request that is aborted finishes at its slot's first decode after it joins, as SGLang
finishes an aborted running request at its next forward; a held slot whose requests all
finished joins with none (docs/sglang-vpp.md, "Decode micro-batches", says what the client
sees). ``num_aborted_while_held`` counts the requests that joined carrying an abort.

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
        self.record = record
        """Writes a ``decode`` decision record (``trace_records.DECODE``)."""
        self.in_flight: set[int] = set()
        """Slots whose batch is scheduled and its result not yet processed."""
        self.held: set[int] = set()
        """Prefill-only slots whose running requests wait for a decode slot (not decoding)."""
        self.num_moved = 0
        self.num_aborted_while_held = 0
        """Requests aborted while held (``to_finish`` set), counted when their slot joins."""

    def before_schedule(self, slot: int) -> None:
        self._ask(slot)
        self._join_held()

    def on_scheduled(self, slot: int, batch: Any) -> None:
        if batch is not None:
            if slot in self.held and not batch.forward_mode.is_extend():
                raise AssertionError(f"slot {slot} holds its requests but SGLang scheduled them to decode")
            self.in_flight.add(slot)

    def on_result(self, slot: int) -> None:
        self.in_flight.discard(slot)
        self._ask(slot)
        self._join_held()

    def _ask(self, slot: int) -> None:
        s = self.s
        last, running = s.last_mbs[slot], s.running_mbs[slot]
        ended = last is not None and last.forward_mode.is_extend() and last is not running
        # What SGLang's get_next_batch_to_run would merge: the prefill's unfinished requests but
        # a chunked one, whose next chunk comes in a later prefill batch.
        exclude = [req for req in (s.chunked_req, last.chunked_req if ended else None) if req is not None]
        moving = ended and any(not req.finished() and req not in exclude for req in last.reqs)
        move = self.controller.decode_move(slot, prefill_ended=moving, running=self._running(),
                                           in_flight=self.in_flight)
        if move is None:
            return
        if move.holds:
            if moving or slot not in self.held:
                self.record(**move.record())
            if ended:
                last.filter_batch(reqs_to_exclude=exclude)
                self._merge_into(slot, last)
                s.last_mbs[slot] = None
            self.held.add(slot)
            s.running_mbs[slot].is_prefill_only = True
            if s.running_batch is running:  # the merge may have made the prefill the running batch
                s.running_batch = s.running_mbs[slot]
            return
        self.record(**move.record())
        if ended:
            last.filter_batch(reqs_to_exclude=exclude)
            self._merge_into(move.chosen, last)
            s.last_mbs[slot] = None
        self._take(slot, move.chosen)

    def _join_held(self) -> None:
        if not self.held:
            return
        for move in self.controller.decode_joins(self.held, running=self._running(), in_flight=self.in_flight):
            self.record(**move.record())
            self._take(move.from_slot, move.chosen)

    def _take(self, slot: int, target: int) -> None:
        """Move ``slot``'s running requests into decode slot ``target``."""
        s = self.s
        running = s.running_mbs[slot]
        if slot in self.held:
            self.num_aborted_while_held += sum(req.to_finish is not None for req in running.reqs)
            self.held.discard(slot)
        if running.is_empty():
            running.is_prefill_only = False  # a released slot's empty batch carries no hold
        else:
            self._merge_into(target, running)
            s.running_mbs[slot] = type(running)(reqs=[], batch_is_full=False)
        into = s.running_mbs[target]
        # A held batch carries the flag that stops SGLang decoding it; SGLang's own value for a
        # batch is that every request is prefill-only (ScheduleBatch.init_new, merge_batch).
        into.is_prefill_only = bool(into.reqs) and all(req.is_prefill_only for req in into.reqs)
        if s.running_batch is running:
            s.running_batch = s.running_mbs[slot]
        self.num_moved += 1

    def _running(self) -> dict[int, int]:
        return {slot: batch.batch_size() for slot, batch in enumerate(self.s.running_mbs)}

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
