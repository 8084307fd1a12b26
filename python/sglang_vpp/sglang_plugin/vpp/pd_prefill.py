"""The prefill side of a prefill-decode split inside the VPP loop (``--disaggregation-mode prefill``).

SGLang's ``event_loop_pp_disagg_prefill`` adds three steps to the stock PP loop; the VPP loop
runs them through SGLang's own methods, at points every rank reaches in the same order of rank
0's event log (``replica.py``):

- bootstrap admission: rank 0 reads the PP consensus of each waiting sender
  (``poll_pp_consensus``: every rank's state, replicated to rank 0 by SGLang's consensus store),
  the TP ranks of rank 0 agree on the minimum, rank 0 applies the verdict, and when that took a
  request off SGLang's bootstrap queue (bootstrapped or failed; one waiting for a free metadata
  buffer stays, unchanged) it is logged as ``("pd", "boot", polls)``; every rank applies it with
  ``process_bootstrapped_queue``
  (the around hook on ``poll_and_all_reduce_prefill_pp`` hands the logged verdict to
  ``pop_bootstrapped``). Bootstrap only moves requests to the waiting queue: which of them form
  a micro-batch, and when it is admitted, stays with SGLang's batching and the controller.
- KV sends: SGLang sends a request's computed KV when it schedules the request's next chunk,
  and rank 0's ``run_batch`` sends the cached prefix (``req.prefix_len``: every chunk scheduled
  so far) before the forward; under fold-back the second stage of those chunks may not have run
  on this rank yet, so every send but the last chunk's is held back (``around_send_kv_chunk``)
  and made when the chunk's result is applied
  (``process_result``): on rank 0 after the last stage, on rank r when rank 0's result event
  arrives, which is after rank r's fold-back stage of that micro-batch. The last chunk (with
  the aux data: first token) is SGLang's own send from ``process_batch_result_disagg_prefill``,
  at the same point.
- transfer done: rank 0 releases a request once every PP rank's transfer of it ended (Success
  or Failed, each rank's own status in the consensus store, not the sender's remembered
  verdict, which a poll of this rank alone can set) on every TP rank of rank 0; it logs
  ``("pd", "release", rids)`` and every rank frees those with
  ``process_disagg_prefill_inflight_queue(rids)``; a scheduling turn follows, where SGLang
  frees what its batch building still holds of them.

- refused on ``--device cpu``: a decode server at another ``--tp-size`` (its attention TP, read
  from its registration on the first transfer), whose KV takes Mooncake's head-sliced path
  (``send_kvcache_slice``: one transfer per token and layer). On this CPU those transfers stalled
  with idle cores, 15 to 60 s, under stock PP too (its cause in Mooncake's TCP transport is not
  known); behind a VPP prefill 3 of 4 requests once failed after Mooncake's 30 s progress
  bound. A decode server with the plugin refuses such a request itself, with a 400 naming both
  sizes and the fix, before it opens a session (``sglang_plugin/pd_guard.py``). Behind one
  without it the transfer fails at once here (``around_send_kvcache_slice``): the prefill log
  names both sizes and the fix; the client gets SGLang's failed-transfer error, and Mooncake
  marks the decode session failed, so later requests fail at once too (docs/pd.md).

Rank 0 polls after each ``ingest_requests`` (a TP collective, so the TP ranks of rank 0 poll at
the same points); a verdict that admits requests wakes an idle loop.
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

from sglang_vpp.sglang_plugin.pd_guard import head_sliced_refusal

from .errors import SchedulerDivergenceError

logger = logging.getLogger(__name__)

__all__ = ["PdPrefill", "POLL_PREFILL_PP", "SEND_KV_CHUNK", "SEND_KVCACHE_SLICE", "around_poll_prefill_pp",
           "around_send_kv_chunk", "around_send_kvcache_slice", "head_sliced_refusal"]

_S = "sglang.srt."
POLL_PREFILL_PP = _S + "disaggregation.utils.poll_and_all_reduce_prefill_pp"
SEND_KV_CHUNK = _S + "disaggregation.prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk"
SEND_KVCACHE_SLICE = _S + "disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache_slice"

RELEASE_WAIT_S = 10.0
"""Longest wait for this rank's sender to conclude a transfer every rank's status says ended."""

_VERDICT: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("sglang_vpp_pd_verdict", default=None)
_RESULT_SENDS: contextvars.ContextVar[bool] = contextvars.ContextVar("sglang_vpp_pd_result_sends", default=False)


def around_poll_prefill_pp(original, pollers, *args: Any, **kwargs: Any) -> list[int]:
    """Inside the VPP loop the bootstrap verdict is rank 0's logged one, not a PP-ring sync."""
    verdict = _VERDICT.get()
    if verdict is None:
        return original(pollers, *args, **kwargs)
    if len(verdict) != len(pollers):
        raise SchedulerDivergenceError(
            f"VPP PD: the bootstrap verdict covers {len(verdict)} requests but this rank's bootstrap "
            f"queue holds {len(pollers)}; the replicated schedulers diverged"
        )
    return list(verdict)


def around_send_kv_chunk(original, self: Any, req: Any, last_chunk: bool = False, end_idx: Any = None):
    """Hold back every send of a middle chunk but ``PdPrefill.process_result``'s: made earlier,
    the KV of this rank's fold-back stage of a scheduled chunk may not be computed yet."""
    if not last_chunk and not _RESULT_SENDS.get():
        return None
    return original(self, req, last_chunk=last_chunk, end_idx=end_idx)


_REFUSALS_LOGGED: set[tuple[str, int, int]] = set()
"""(decode session, prefill TP, decode TP) already logged: a refused request fails on its first
transfer, but each of its chunks comes here on every rank: one line per session and rank process says it."""


def around_send_kvcache_slice(original, self: Any, mooncake_session_id: str, prefill_kv_indices: Any,
                              dst_kv_ptrs: list, dst_kv_indices: Any, dst_tp_rank: int, dst_attn_tp_size: int,
                              *args: Any, **kwargs: Any) -> int:
    """Fail the transfer (-1: SGLang fails the request and answers its client with its own
    failed-transfer error); the reason and the fix go to this server's log, once per decode
    session and pair of sizes."""
    key = (str(mooncake_session_id), int(self.attn_tp_size), int(dst_attn_tp_size))
    if key not in _REFUSALS_LOGGED:
        _REFUSALS_LOGGED.add(key)
        logger.error("sglang-vpp: %s (decode session %s)", head_sliced_refusal(key[1], key[2]), key[0])
    return -1


def _terminal(status: Any) -> bool:
    from sglang.srt.disaggregation.base.conn import KVPoll

    return status in (KVPoll.Success, KVPoll.Failed)


class PdPrefill:
    """One rank's PD prefill steps; ``Replica`` calls ``plan`` and ``process_result``, the
    loop calls ``leader_poll`` (rank 0) and ``replay`` (every rank, for ``("pd", ...)`` events)."""

    def __init__(self, scheduler: Any, rank: int, tp: Any) -> None:
        self.s = scheduler
        self.rank = rank
        self.tp = tp
        self.num_sent_chunks = 0
        self.num_released = 0

    # ------------------------------------------------------------------ scheduling
    def plan(self, running_batch: Any, last_batch: Any) -> Any:
        """What ``event_loop_pp_disagg_prefill`` does to build a micro-batch (its KV sends are
        held back by ``around_send_kv_chunk``)."""
        s = self.s
        running_batch.batch_is_full = False  # stock resets it after every micro-batch
        # An abort only marks a request in chunked prefill; SGLang's PP prefill loop never ends it
        # (sglang_plugin/pd_abort.py). Every rank replays this step at the same event, so all end it.
        s.process_pending_chunked_abort()
        s.process_prefill_chunk(last_batch=last_batch, running_batch=running_batch)
        return s.get_new_batch_prefill(running_batch)

    def process_result(self, batch: Any, result: Any) -> None:
        """Apply a micro-batch's result (SGLang sends finished requests' last chunk), then send
        each continuing request's chunk of this micro-batch: both of this rank's stages ran."""
        s = self.s
        middle = []
        if batch.forward_mode.is_extend():
            for i, req in enumerate(batch.reqs):
                if req.inflight_middle_chunks > 0:
                    middle.append((req, int(batch.prefix_lens[i]) + int(batch.extend_lens[i])))
        s._pp_process_batch_result(batch, result)
        token = _RESULT_SENDS.set(True)
        try:
            for req, end in middle:
                if req.disagg_kv_sender is not None and not req.pending_bootstrap and req.metadata_buffer_index >= 0:
                    s.send_kv_chunk(req, last_chunk=False, end_idx=end)
                    self.num_sent_chunks += 1
        finally:
            _RESULT_SENDS.reset(token)

    # ------------------------------------------------------------------ rank 0's polls
    def leader_poll(self, events: list) -> bool:
        """Poll bootstrap and transfers; log and apply what changed. True: requests were admitted
        or released, so the loop runs a scheduling turn (an idle loop would not): SGLang frees
        what its batch building still holds of the released requests there."""
        admitted = self._poll_bootstrap(events)
        released = self._poll_transfers(events)
        return admitted or released

    def _poll_bootstrap(self, events: list) -> bool:
        from sglang.srt.disaggregation.base.conn import KVPoll

        queue = self.s.disagg_prefill_bootstrap_queue.queue
        if not queue:
            return False
        polls = [int(req.disagg_kv_sender.poll_pp_consensus()) for req in queue]
        polls = self.tp.ready(polls, "the PD bootstrap verdict")
        if all(poll == KVPoll.Bootstrapping for poll in polls):
            return False
        queued, before = len(queue), len(self.s.waiting_queue)
        self._apply_boot(polls)
        if len(self.s.disagg_prefill_bootstrap_queue.queue) == queued:
            # SGLang changes a request's state only when it takes it off the queue; one that stays
            # waits for a free metadata buffer, held by requests still in transfer, and would
            # otherwise be logged again, unchanged, after every poll (500 a second when idle),
            # each a message down the pipeline and a replay on every rank.
            return False
        events.append(("pd", "boot", polls))
        return len(self.s.waiting_queue) > before

    def _poll_transfers(self, events: list) -> bool:
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

        inflight = self.s.disagg_prefill_inflight_queue
        if not inflight:
            return False
        done = []
        for req in inflight:
            # The consensus is the minimum over the PP ranks: Success means every rank's
            # transfer succeeded; Failed, that one failed while another may still be sending,
            # so then every rank's own status must have ended too. A sender keeps the first
            # ended state any poll of it saw, and SGLang's release step polls every in-flight
            # sender on this rank alone: this rank's own Success would then read as every
            # rank's, and a later rank would be told to free a request it is still sending. So
            # each rank's own status is read from the consensus store as well. A health check's
            # or warm-up's fake sender sends nothing and has no status of its own; its room (0)
            # may be a real request's, whose statuses are not its own.
            sender = req.disagg_kv_sender
            consensus = sender.poll_pp_consensus()
            store = sender.kv_mgr.request_status
            room = req.bootstrap_room
            if req.bootstrap_host == FAKE_BOOTSTRAP_HOST or room not in store:
                ended = _terminal(consensus)
            elif consensus == KVPoll.Failed:
                ended = all(_terminal(status) for status in store.collect(room) if status is not None)
            else:
                ended = _terminal(consensus) and all(
                    status is not None and _terminal(status) for status in store.collect(room))
            done.append(int(ended))
        done = self.tp.ready(done, "the PD transfer-done verdict")
        rids = [req.rid for req, flag in zip(inflight, done) if flag]
        if rids:
            self._apply_release(rids)
            events.append(("pd", "release", rids))
        return bool(rids)

    # ------------------------------------------------------------------ every rank
    def replay(self, event: tuple) -> None:
        kind = event[1]
        if kind == "boot":
            self._apply_boot(event[2])
        elif kind == "release":
            self._apply_release(event[2])
        else:
            raise AssertionError(f"unknown PD event {kind!r}")

    def _apply_boot(self, polls: list[int]) -> None:
        token = _VERDICT.set(list(polls))
        try:
            self.s.process_bootstrapped_queue()
        finally:
            _VERDICT.reset(token)

    def _wait_local_conclusion(self, rids: set[str]) -> None:
        """Every rank frees the released requests at the same point of the log, so wait (bounded)
        until this rank's own sender says so: its status can read Success a moment before the
        transfer worker's bookkeeping lets ``poll`` say it."""
        pending = [req for req in self.s.disagg_prefill_inflight_queue if req.rid in rids]
        deadline = time.monotonic() + RELEASE_WAIT_S
        while pending and time.monotonic() < deadline:
            pending = [req for req in pending if not _terminal(req.disagg_kv_sender.poll())]
            if pending:
                time.sleep(0.001)

    def _apply_release(self, rids: list[str]) -> None:
        self._wait_local_conclusion(set(rids))
        done = self.s.process_disagg_prefill_inflight_queue(list(rids))
        self.num_released += len(done)
        kept = sorted(set(rids) - {req.rid for req in done})
        if kept:
            # Rank 0 never names these again: kept here, their KV would stay held on this rank
            # alone, and its pool would no longer be rank 0's.
            raise SchedulerDivergenceError(
                f"VPP PD rank {self.rank}: rank 0 released requests {kept} (their KV transfer ended on "
                f"every rank), but this rank's own KV sender has not concluded them after "
                f"{RELEASE_WAIT_S:g} s, or this rank does not hold them; the transfer backend on this "
                "rank is stuck or the replicated schedulers diverged"
            )


def pd_prefill_for(scheduler: Any, rank: int, tp: Any) -> PdPrefill | None:
    """The PD steps when this server is a prefill server of a split, else None."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    if getattr(scheduler, "disaggregation_mode", None) != DisaggregationMode.PREFILL:
        return None
    return PdPrefill(scheduler, rank, tp)
