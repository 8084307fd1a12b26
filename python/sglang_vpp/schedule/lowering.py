"""Lowering: the planner's decisions -> per-rank action streams (computes, sends, receives).

The planner decides *what* runs *when* (with the ``Controller``); this pass only writes it down
as the action IR every executor runs, with the group and the semantics the controller gives each
hand-off (``Controller.hand_off``):

- a compute of stage s on rank r: ``async`` semantics receive the input right before it (when
  stage s-1 ran on another rank) and post the output's send right after it (when stage s+1 runs
  on another rank);
- a ``blocking`` hand-off: the send on the producer and the receive on the consumer, emitted at
  the same point of the planner's single global order (a rendezvous both ranks can follow).

[Note: fold point has no comm] stages P-1 and P share rank P-1, so nothing is emitted between them.
"""

from __future__ import annotations

from .controller import Controller
from .ir import Action, ChunkSpec, recv, send
from .ir import compute as compute_action
from .policies import CommSemantics

__all__ = ["Lowering"]


class Lowering:
    def __init__(self, controller: Controller) -> None:
        self.actions: list[list[Action]] = [[] for _ in range(controller.layout.num_ranks)]
        # A stage's hand-off is fixed by the layout and the policy: asked once per stage.
        self._hand_offs = [controller.hand_off(stage) for stage in range(controller.layout.num_stages)]

    def compute(self, rank: int, stage: int, chunk: ChunkSpec) -> None:
        """Stage ``stage`` of ``chunk`` on ``rank``, with its ``async`` receive and send."""
        request, index = chunk.request_index, chunk.chunk_index
        incoming = self._hand_offs[stage - 1] if stage > 0 else None
        if incoming is not None and incoming.semantics is CommSemantics.ASYNC:
            self.actions[rank].append(recv(stage - 1, request, index, incoming.src_rank, incoming.group))
        self.actions[rank].append(compute_action(stage, request, index))
        outgoing = self._hand_offs[stage]
        if outgoing is not None and outgoing.semantics is CommSemantics.ASYNC:
            self.actions[rank].append(send(stage, request, index, outgoing.dst_rank, outgoing.group))

    def handoff(self, stage: int, chunk: ChunkSpec) -> None:
        """A ``blocking`` hand-off of ``stage``'s output (both ends at once)."""
        hand = self._hand_offs[stage]
        assert hand is not None and hand.semantics is CommSemantics.BLOCKING, (stage, hand)
        self.actions[hand.src_rank].append(send(stage, chunk.request_index, chunk.chunk_index, hand.dst_rank, hand.group))
        self.actions[hand.dst_rank].append(recv(stage, chunk.request_index, chunk.chunk_index, hand.src_rank, hand.group))
