"""The scheduler state every rank replicates, and the events that change it.

SGLang's pipeline mode runs a full scheduler on every rank; they stay identical because every
rank applies the same inputs in the same order. Under VPP the owner of the last virtual stage
is rank 0, so rank 0 takes every decision and logs it as events; the other ranks replay the
log in order (it travels with the forward-sweep messages):

    ("reqs", [requests])          process_input_requests: new requests, aborts, control requests
    ("sched", slot, signature)    get_next_batch_to_run for micro-batch slot ``slot``
    ("result", slot, outputs)     process the sampled outputs of the slot's batch (tensors on CPU,
                                  the dict of ``_pp_prepare_tensor_dict``)
    ("idle",)                     on_idle housekeeping (it resets the new-token ratio)
    ("grammar", ready, failed, rids)
                                  which requests waiting on their grammar rank 0's next "sched" call
                                  found ready or timed out (grammar_sync.py)
    ("pd", kind, ...)             a PD prefill server's bootstrap or release verdict (pd_prefill.py)
    ("auto", lengths, size, tap, seen)
                                  ``--chunked-prefill-size auto``: the cut rank 0's controller chose
                                  for the situation ``lengths``, tapered or not, applied from the
                                  next batch; ``seen``: rank 0's situation then
                                  (chunk_sizing.AutoSituation)

Slots are SGLang's micro-batch slots (``mbs``/``running_mbs``/``last_mbs``): a slot is reused
only after its batch's outputs are processed, as in stock PP. A follower checks that its replayed
decision has the signature rank 0 logged and raises ``SchedulerDivergenceError`` if not.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .errors import SchedulerDivergenceError

__all__ = ["PP_LOOP_STATE", "Replica", "batch_signature", "outputs_to_cpu"]

_SET_HERE = "set by Replica.__init__ for VPP's slots"
_STOCK_COMM = "stock PP's own send/receive state; the VPP loop sends through sglang_vpp.comm"
PP_LOOP_STATE: dict[str, str] = {
    **dict.fromkeys(("pp_loop_size", "mbs", "last_mbs", "running_mbs", "mb_metadata", "pp_outputs",
                     "_pp_spec_relay"), _SET_HERE),
    **dict.fromkeys(("last_rank_comm_queue", "send_req_work", "send_proxy_work", "send_output_work",
                     "send_proxy_requires_forward_fence", "launch_event", "pp_proxy_recv_event",
                     "pp_send_done_event", "pp_comm_stream", "pp_comm_stream_ctx", "_pp_tensor_dict_inbox"),
                    _STOCK_COMM),
}  # fmt: skip
"""Every attribute SGLang's ``Scheduler.init_pp_loop_state`` sets (the VPP loop replaces the
loop that calls it), and why the VPP loop does or does not set it; a test compares this with
the installed SGLang's code, so new loop state in an upgrade is not silently left unset."""


def batch_signature(batch: Any) -> tuple | None:
    """What must agree across ranks: mode, requests, lengths, KV slot count."""
    if batch is None:
        return None
    return (
        str(batch.forward_mode),
        tuple(req.rid for req in batch.reqs),
        tuple(int(x) for x in batch.seq_lens.tolist()),
        int(batch.out_cache_loc.numel()) if batch.out_cache_loc is not None else -1,
    )


def outputs_to_cpu(outputs: dict) -> dict:
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in outputs.items()}


class Replica:
    """Applies scheduler events to this rank's scheduler (leader and followers alike)."""

    def __init__(self, scheduler: Any, num_slots: int, rank: int) -> None:
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        self.scheduler = scheduler
        self.rank = rank
        self.num_slots = num_slots
        # The stock names, so SGLang's own helpers (_pp_microbatches_drained, is_fully_idle) work.
        scheduler.pp_loop_size = num_slots
        scheduler.mbs = [None] * num_slots
        scheduler.last_mbs = [None] * num_slots
        scheduler.running_mbs = [ScheduleBatch(reqs=[], batch_is_full=False) for _ in range(num_slots)]
        scheduler.mb_metadata = [None] * num_slots
        scheduler.pp_outputs = None
        scheduler._pp_spec_relay = False
        self.num_events = 0
        self.pd: Any = None
        """``pd_prefill.PdPrefill`` on a PD prefill server: it builds micro-batches the way SGLang's
        PD prefill loop does, applies results and replays ``("pd", ...)`` events."""
        self.regroup: Any = None
        """A ``decode_slots.DecodeRegrouper`` keeping decode in the controller's decode slots."""
        self.auto: Any = None
        """A ``chunk_sizing.AutoSituation`` when the controller sizes chunks ``auto``."""
        self.grammar: Any = None
        """The ``grammar_sync.GrammarDecisions`` of this rank (constrained decoding)."""

    def ingest(self, requests: list) -> None:
        self.num_events += 1
        self.scheduler.process_input_requests(requests)

    def schedule(self, slot: int) -> Any:
        s = self.scheduler
        self.num_events += 1
        if self.regroup is not None:
            self.regroup.before_schedule(slot)
        s.running_batch = s.running_mbs[slot]
        s.last_batch = s.last_mbs[slot]
        build = self.pd.plan if self.pd is not None else s.get_next_batch_to_run
        plan = build(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        s.running_mbs[slot] = plan.running_batch
        s.mbs[slot] = plan.batch_to_run
        s.cur_batch_for_debug = plan.batch_to_run
        if self.regroup is not None:
            self.regroup.on_scheduled(slot, plan.batch_to_run)
        return plan.batch_to_run

    def mark_launched(self, batch: Any) -> None:
        """On followers, the per-batch counters ``Scheduler.run_batch`` sets on rank 0 (they
        never call run_batch: their stages run through the worker directly)."""
        s = self.scheduler
        s.forward_ct += 1
        batch.forward_iter = s.forward_ct
        batch.launch_ts = time.monotonic()
        batch.after_idle_gap = s._sched_idled
        s._sched_idled = False

    def apply_result(self, slot: int, outputs: dict) -> None:
        from sglang.srt.managers.scheduler_pp_mixin import PPBatchMetadata
        from sglang.srt.model_executor.forward_batch_info import PPProxyTensors

        s = self.scheduler
        self.num_events += 1
        batch = s.mbs[slot]
        assert batch is not None, f"rank {self.rank}: result for empty slot {slot}"
        s.running_batch = s.running_mbs[slot]
        s.last_batch = s.last_mbs[slot]
        metadata = PPBatchMetadata(can_run_cuda_graph=False)
        result = s._pp_prep_batch_result(batch, metadata, PPProxyTensors(dict(outputs)))
        if self.pd is not None:
            self.pd.process_result(batch, result)
        else:
            s._pp_process_batch_result(batch, result)
        s.last_mbs[slot] = batch
        if self.regroup is not None:
            self.regroup.on_result(slot)

    def idle(self) -> None:
        self.num_events += 1
        self.scheduler.on_idle()

    def replay(self, event: tuple) -> Any:
        """Apply one logged event; returns the batch of a "sched" event, else None."""
        kind = event[0]
        if kind == "reqs":
            self.ingest(event[1])
        elif kind == "sched":
            _, slot, expected = event
            batch = self.schedule(slot)
            if self.grammar is not None:
                self.grammar.check_taken(self.num_events)
            actual = batch_signature(batch)
            if actual != expected:
                raise SchedulerDivergenceError(
                    f"VPP rank {self.rank}: replayed scheduling decision {self.num_events} for slot {slot} "
                    f"differs from rank 0's: expected {expected}, got {actual}. The replicated schedulers "
                    "diverged (a non-deterministic scheduling input?); report this with the server log."
                )
            return batch
        elif kind == "result":
            self.apply_result(event[1], event[2])
        elif kind == "idle":
            self.idle()
        elif kind == "pd":
            self.pd.replay(event)
        elif kind == "auto":
            self.auto.replay(event, self.rank)
        elif kind == "grammar":
            self.grammar.replay(event)
        else:
            raise AssertionError(f"unknown event {kind!r}")
        return None
