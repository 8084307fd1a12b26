"""Cross-request pipelined packing for ``--pp-mode vpp-pack`` (method section 3.4).

When the last prefill chunk of a request has been admitted, rank 0 faces a drain window: the
chunk's middle stages run on the other ranks while rank 0 has only fold-back work left. The gate
opens extra micro-batch slots (beyond the in-flight limit) for the next request's leading chunks
while their estimated stage-0 cost fits the estimated window, cheapest (earliest) chunks first,
which is the order SGLang's scheduler produces anyway.

Estimates use the schedule core's cost model (``LinearAttentionCost``: linear part plus causal
attention over the prefix), the same estimate the planner uses to order work; only ratios matter.
The window estimate is the last chunk's middle stages (s1 .. s_{2P-2}) minus the fold-back work
rank 0 still owes to older micro-batches, a projection like ``Planner._drain_budget`` restricted
to what rank 0 knows when it admits.
"""

from __future__ import annotations

from typing import Any

from sglang_vpp.schedule import ChunkSpec, LinearAttentionCost

from .state import VppState

__all__ = ["PackGate"]


class PackGate:
    def __init__(self, state: VppState, scheduler: Any) -> None:
        assert state.layout is not None
        self.layout = state.layout
        self.scheduler = scheduler
        self.cost = LinearAttentionCost()
        self.extra_slots = state.layout.num_ranks
        """At most P packed micro-batches per drain window."""
        self.window_seq: int | None = None
        self.window_rids: frozenset[str] = frozenset()
        self.budget = 0.0
        self.num_packed = 0

    def _stage_cost(self, stage: int, start: int, num_tokens: int) -> float:
        chunk = ChunkSpec(request_index=0, chunk_index=0, start=start, num_tokens=max(1, num_tokens))
        return self.cost.stage_cost(self.layout.stages[stage], chunk)

    def _batch_chunk(self, job: Any) -> tuple[int, int]:
        batch = job.batch
        prefix = max((int(x) for x in (batch.prefix_lens or [0])), default=0)
        return prefix, max(1, job.num_tokens)

    def on_admit(self, job: Any) -> None:
        if not job.is_prefill:
            return
        if self.window_seq is not None and job.seq > self.window_seq:
            start, size = self._batch_chunk(job)
            self.budget -= self._stage_cost(0, start, size)
            self.num_packed += 1
        if getattr(job.batch, "contains_last_prefill_chunk", False):
            start, size = self._batch_chunk(job)
            middle = sum(self._stage_cost(s, start, size) for s in range(1, self.layout.last_stage))
            self.window_seq = job.seq
            self.window_rids = frozenset(req.rid for req in job.batch.reqs)
            self.budget = middle

    def on_finish(self, job: Any) -> None:
        if job.seq == self.window_seq:
            self.window_seq = None
            self.budget = 0.0

    def admit_extra(self, jobs: dict) -> bool:
        """May one more micro-batch start beyond the in-flight limit now?"""
        if self.window_seq is None or self.window_seq not in jobs:
            return False
        s = self.scheduler
        chunked = getattr(s, "chunked_req", None)
        if chunked is not None:
            if chunked.rid in self.window_rids:
                return False
            start = int(chunked.prefix_len or 0)
        elif s.waiting_queue:
            start = 0
        else:
            return False
        owed = sum(
            self._stage_cost(self.layout.last_stage, *self._batch_chunk(job))
            for seq, job in jobs.items()
            if seq < self.window_seq and job.is_prefill
        )
        size = int(getattr(s, "chunked_prefill_size", 0) or 1)
        return self._stage_cost(0, start, size) <= self.budget - owed
