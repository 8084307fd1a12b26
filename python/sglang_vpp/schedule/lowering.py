"""Lowering: the planner's decisions -> per-rank action streams (computes, sends, receives).

The planner decides *what* runs *when* (with the ``Controller``); this pass only writes it down
as the action IR every executor runs:

- a compute of stage s on rank r: ``async`` semantics receive the input right before it (when
  stage s-1 ran on another rank) and post the output's send right after it (when stage s+1 runs
  on another rank);
- a ``blocking`` hand-off: the send on the producer and the receive on the consumer, emitted at
  the same point of the planner's single global order (a rendezvous both ranks can follow).

The group of a hand-off is ``pp`` with one group, else ``fwd`` (r -> r+1) or ``bwd`` (r+1 -> r).
[Note: fold point has no comm] stages P-1 and P share rank P-1, so nothing is emitted between them.
"""

from __future__ import annotations

from .ir import GROUP_BACKWARD, GROUP_FORWARD, GROUP_SINGLE, Action, ChunkSpec, compute, recv, send
from .layout import Layout

__all__ = ["Lowering"]


class Lowering:
    def __init__(self, layout: Layout, blocking: bool, num_groups: int) -> None:
        self._stage_rank = [s.rank for s in layout.stages]
        self._last_stage = layout.num_stages - 1
        self._blocking = blocking
        self._num_groups = num_groups
        self.actions: list[list[Action]] = [[] for _ in range(layout.num_ranks)]

    def compute(self, rank: int, stage: int, chunk: ChunkSpec) -> None:
        """Stage ``stage`` of ``chunk`` on ``rank``, with its ``async`` receive and send."""
        request, index = chunk.request_index, chunk.chunk_index
        if stage > 0 and not self._blocking:
            producer = self._stage_rank[stage - 1]
            if producer != rank:
                self.actions[rank].append(recv(stage - 1, request, index, producer, self.group(producer, rank)))
        self.actions[rank].append(compute(stage, request, index))
        consumer = None if stage == self._last_stage else self._stage_rank[stage + 1]
        if consumer is not None and consumer != rank and not self._blocking:
            self.actions[rank].append(send(stage, request, index, consumer, self.group(rank, consumer)))

    def handoff(self, src: int, dst: int, stage: int, chunk: ChunkSpec) -> None:
        """A ``blocking`` hand-off of ``stage``'s output from ``src`` to ``dst`` (both ends at once)."""
        assert self._blocking
        group = self.group(src, dst)
        self.actions[src].append(send(stage, chunk.request_index, chunk.chunk_index, dst, group))
        self.actions[dst].append(recv(stage, chunk.request_index, chunk.chunk_index, src, group))

    def group(self, src: int, dst: int) -> str:
        if self._num_groups == 1:
            return GROUP_SINGLE
        return GROUP_FORWARD if dst > src else GROUP_BACKWARD
