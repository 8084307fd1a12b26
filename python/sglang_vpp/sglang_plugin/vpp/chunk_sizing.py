"""Chunk sizes from the controller, the one place that decides them.

The planner, the simulator and the reference runtime cut requests with the controller's chunker
(``schedule.default_chunker``: fixed chunks, or a ``TaperedChunker`` for vpp-taper); the server
asks the same controller. SGLang varies chunk sizes through its dynamic-chunking slot,
``Scheduler.dynamic_chunk_sizer``, whose ``predict(history_len)`` sets the token budget of the
batch that continues the chunked request (VPP refuses ``--enable-dynamic-chunking``, so the slot
is free). ``ControllerChunkSizer`` fills that slot when the VPP loop starts; for modes whose first
chunk is not the full budget a hook also asks it for a request's first chunk, which SGLang always
cuts at ``--chunked-prefill-size``:

    managers.schedule_policy.PrefillAdder.add_one_req  AROUND  first chunk of a request (vpp-taper)

Every rank replays the same scheduling decisions (``replica.py``) and the chunker is a pure
function of (prefix, remaining), so every rank cuts the same chunks.

With ``--chunked-prefill-size auto`` the size also depends on the situation: before SGLang forms
a batch, rank 0 gives the controller's ``auto`` sizer the prompt lengths waiting and in flight
(``AutoSituation``: the first in the loop, later ones in a planner process), and the size chosen
becomes the chunk size of the requests and, on a server that only prefills, the budget of a
batch that starts with a new request (the hook above lowers SGLang's budget to
``Controller.new_batch_budget``, which keeps the cap where the server also decodes). The size
travels to the other ranks as a scheduler event, ``("auto", lengths, size, tapered, seen)``,
replayed just before the batch it sizes; each rank checks that its replica of the scheduler
holds what rank 0's held (``seen``).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from itertools import islice
from typing import Any, Callable

from sglang_vpp.plan_process import AutoPlanner, planner_for
from sglang_vpp.schedule import Controller, TaperedChunker

from .errors import SchedulerDivergenceError

logger = logging.getLogger(__name__)

PLAN_TIMEOUT_S = 300.0
"""The longest rank 0 lets a plan off the loop run before it stops the planner: plans take 0.1-2 s
(docs/auto-chunk.md, "Server"), so one this late is stuck (a stopped or wedged child), and a size
that never comes would leave every later situation unplanned."""

__all__ = ["ControllerChunkSizer", "install_chunk_sizer", "around_add_one_req", "taper_note", "ADD_ONE_REQ",
           "AUTO_EVENT", "AutoSituation", "situation"]

AUTO_EVENT = "auto"

ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"

_sizer: ControllerChunkSizer | None = None
"""This process's sizer (one scheduler per process); the adder hook has no scheduler to ask."""


class ControllerChunkSizer:
    """SGLang's ``DynamicChunkSizer`` interface, answered by ``Controller.next_chunk_size``."""

    def __init__(self, scheduler: Any, controller: Controller) -> None:
        self.scheduler = scheduler
        self.controller = controller

    def size(self, prefix_len: int, length: int) -> int:
        """Tokens of the next chunk of a ``length``-token sequence with ``prefix_len`` computed."""
        return self.controller.next_chunk_size(prefix_len, max(1, length - prefix_len))

    def predict(self, history_len: int) -> int:
        """Budget of the batch that continues ``scheduler.chunked_req`` (SGLang calls this)."""
        # SGLang's adder cuts a chunk at the chunk budget (its rem_chunk_tokens), never at
        # --max-prefill-tokens, which only stops further requests joining; a budget below the
        # chunk size would split a request's last chunk, unlike stock SGLang and the planner.
        full = max(1, int(self.scheduler.chunked_prefill_size))
        req = self.scheduler.chunked_req
        if req is None:
            return self.controller.next_chunk_size(history_len, full)
        return self.controller.batch_budget(history_len, max(1, _length(req) - history_len), full)


def install_chunk_sizer(scheduler: Any, controller: Controller) -> ControllerChunkSizer:
    """Put the controller's chunk sizes into SGLang's slot (and the first-chunk hook's reach)."""
    global _sizer
    _sizer = ControllerChunkSizer(scheduler, controller)
    scheduler.dynamic_chunk_sizer = _sizer
    return _sizer


def taper_note(controller: Controller, chunk_size: int) -> str | None:
    """A start-up line when vpp-taper's chunker has nothing to taper at this chunk size (the
    server then cuts chunks exactly as vpp-pack does), else None."""
    chunker = controller.chunker
    if not isinstance(chunker, TaperedChunker) or chunker.tapers:
        return None
    return (f"vpp-taper: at --chunked-prefill-size {chunk_size} every chunk is the full size (the ramps "
            f"step in units of {chunker.alignment} tokens), so this server cuts chunks as vpp-pack does; "
            f"use a chunk size above {chunker.alignment} to taper")


def _length(req: Any) -> int:
    return len(req.origin_input_ids) + len(req.output_ids)


def situation(scheduler: Any, limit: int) -> tuple[int, ...]:
    """The prompt lengths ``auto`` sizes for when a batch is formed: the request being chunked,
    then the waiting queue in its order, at most ``limit`` (``Controller.auto_window``: what
    ``auto`` plans; read no further into a long queue). Decoding requests are not in it: the
    plan is of prefill work."""
    chunked = scheduler.chunked_req
    head = [_length(chunked)] if chunked is not None else []
    return tuple(head + [_length(req) for req in islice(scheduler.waiting_queue, max(limit - len(head), 0))])


class AutoSituation:
    """An ``auto`` server's situation reports: rank 0 tells the controller before each batch is
    formed and logs the answer as an event; the other ranks apply the logged answer.

    A plan takes from a tenth of a second to seconds (docs/auto-chunk.md, "Server"), and rank 0's
    loop feeds every rank: planning there would hold the whole pipeline at every arrival. So
    only the first situation is planned in the loop (nothing was sized yet); every later one is
    planned off it, one at a time, while the loop goes on with the size in force, and its answer
    is applied before the first batch formed after it is ready. Planning is pure Python, so off
    the loop means in a child process (``plan_process.ProcessPlanner``, started with the first
    plan): a thread would hold the interpreter lock against the loop. The child holds a copy of
    the sizer, with the answers it held then, and keeps the answers of what it plans (a plan is
    a pure function of the situation, so every copy answers a situation alike)."""

    def __init__(self, scheduler: Any, controller: Controller, record: Callable[..., None],
                 make_planner: Callable[[Controller], AutoPlanner] = planner_for,
                 plan_timeout_s: float = PLAN_TIMEOUT_S) -> None:
        """``record``: writes a ``resize`` trace record (``lengths``, ``size``, ``tapered``);
        ``make_planner``: what plans off the loop (tests pass a ``ThreadPlanner``);
        ``plan_timeout_s``: how long a plan off the loop may take (``PLAN_TIMEOUT_S``)."""
        self.scheduler = scheduler
        self.plan_timeout_s = plan_timeout_s
        self.controller = controller
        self.record = record
        self.told: tuple[int, ...] = ()
        """Rank 0's last situation given to the planner (``before_schedule``); the other ranks
        keep none."""
        self._planning: tuple[tuple[int, ...], Future, float] | None = None
        """Rank 0: the situation being planned off the loop, its answer to come, and when it was
        given (``time.monotonic``)."""
        self.make_planner = make_planner
        self.planner: AutoPlanner | None = None
        """Rank 0's, from its first situation on; the other ranks start none."""

    def before_schedule(self, events: list) -> None:
        """Rank 0, before SGLang forms a batch: apply a finished plan, and give the planner the
        situation when requests arrived since it was last given one. A situation that is the end
        of the last one (requests only left it: batched, or done chunking) keeps that answer: a
        plan per batch would only repeat the last. Nothing waiting and nothing chunked: no batch
        to size. Each applied answer is appended to ``events`` as ``(AUTO_EVENT, lengths, size,
        tapered, seen)``: the situation planned and what rank 0's scheduler holds now."""
        lengths = situation(self.scheduler, self.controller.auto_window)
        if self._planning is not None and self._planning[1].done():
            (planned, answer, _), self._planning = self._planning, None
            choice = answer.result()  # a planning error surfaces here, in the loop
            self._apply(planned, self.controller.adopt_size(planned, choice.chunk_size, choice.tapered),
                        choice.tapered, lengths, events)
        elif self._planning is not None and time.monotonic() - self._planning[2] > self.plan_timeout_s:
            self._stop_stuck_planner()
        if not lengths or lengths == self.told[len(self.told) - len(lengths):]:
            return
        if self.planner is None:  # started now, so a planner process starts while the loop plans
            self.planner = self.make_planner(self.controller)
        if self.controller.auto_size is None:  # nothing sized yet: this batch waits for its plan
            self.told = lengths
            self._apply(lengths, self.controller.resize(lengths), self.controller.auto_tapered, lengths, events)
        elif self._planning is None:
            self.told = lengths
            self._planning = (lengths, self.planner.submit(lengths), time.monotonic())

    def _stop_stuck_planner(self) -> None:
        """A plan that has run past ``plan_timeout_s``: stop the planner and keep the size in
        force; the situation in force is planned again by a fresh planner (``told`` forgotten)."""
        assert self._planning is not None and self.planner is not None
        planned = self._planning[0]
        logger.error(
            "sglang-vpp auto: the planner (%s) gave no answer in %.0f s for a situation of %d prompts "
            "(plans take seconds at most); it is stopped, chunks stay at %s tokens, and a fresh planner "
            "plans the situation in force", _planner_name(self.planner), self.plan_timeout_s, len(planned),
            self.controller.auto_size)
        self._planning = None
        self.told = ()
        self.planner.close()
        self.planner = None

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the plan off the loop, if any, has its answer, at most ``timeout_s`` (tests)."""
        if self._planning is not None:
            wait_futures([self._planning[1]], timeout=timeout_s)

    def close(self) -> None:
        """The scheduler exits: stop the planner, leaving no process behind."""
        self._planning = None
        if self.planner is not None:
            self.planner.close()
            self.planner = None

    def _apply(self, planned: tuple[int, ...], size: int, tapered: bool, seen: tuple[int, ...],
               events: list) -> None:
        self.record(lengths=list(planned), size=size, tapered=tapered)
        events.append((AUTO_EVENT, planned, size, tapered, seen))

    def replay(self, event: tuple, rank: int) -> None:
        """Another rank: apply rank 0's cut, just before the batch it sizes, after checking that
        this rank's replica of the scheduler holds what rank 0's held then."""
        _, lengths, size, tapered, seen = event
        mine = situation(self.scheduler, self.controller.auto_window)
        if mine != tuple(seen):
            raise SchedulerDivergenceError(
                f"VPP rank {rank}: rank 0 sized a batch for prompts of {list(seen)[:8]} tokens, this rank's "
                f"scheduler holds {list(mine)[:8]}. The replicated schedulers diverged; report this with the "
                "server log."
            )
        self.controller.adopt_size(lengths, size, tapered)
        self.record(lengths=list(lengths), size=size, tapered=tapered)


def _planner_name(planner: AutoPlanner) -> str:
    pid = getattr(planner, "pid", None)
    return f"process {pid}" if pid is not None else type(planner).__name__


def around_add_one_req(original: Callable[..., Any], adder: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """Cut a new request's first chunk where the chunker says, when that is below the budget.

    The chunk closes the batch, as a chunk cut at the full budget does in stock SGLang. A batch
    that starts with a new request gets the controller's budget (``new_batch_budget``; a batch
    that continues a chunked request got its budget from ``predict``).
    """
    budget = adder.rem_chunk_tokens
    if _sizer is None or budget is None:
        return original(adder, req, *args, **kwargs)
    if not adder.can_run_list:
        budget = adder.rem_chunk_tokens = _sizer.controller.new_batch_budget(budget)
    prefix_len = int(req.prefix_len)
    length = _length(req)
    first = _sizer.size(prefix_len, length)
    if first >= min(budget, length - prefix_len):
        return original(adder, req, *args, **kwargs)
    adder.rem_chunk_tokens = first
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        if adder.new_chunked_req is not req:  # not admitted: the rest of the budget stays usable
            adder.rem_chunk_tokens = budget - (first - adder.rem_chunk_tokens)
