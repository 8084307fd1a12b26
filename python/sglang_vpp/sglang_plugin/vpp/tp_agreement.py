"""Keep the VPP loops of one pipeline stage's TP ranks in step (``--tp-size > 1``).

With ``--tp-size T --pp-size P`` there are T pipelines (one per TP index); each runs its own
leader and followers over its own PP group, and the hand-offs go between ranks of the same TP
index. Inside a virtual stage the T ranks of a stage run TP collectives, so they must run the
same stages of the same micro-batches in the same order. What a loop does next depends on
which messages have arrived, and arrival times differ between the T pipelines.

The rule: before choosing, the T ranks of a stage all-reduce the MINIMUM of their ready-message
counts (per direction). A message counts as ready only once every TP rank of the stage has it,
so every rank takes the same choice. Requests enter through SGLang's own TP broadcast in
``ingest_requests`` (already a collective of the stage), and every other input of a decision is
replicated state, so the T pipelines carry identical events and identical tensors order.

The all-reduce runs on a gloo group of its own, created with the VPP comm timeout: a stuck or
dead TP peer becomes ``CommTimeoutError`` naming the group, never a hang.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Sequence

import torch

from .errors import CommTimeoutError

logger = logging.getLogger(__name__)

__all__ = ["TpAgreement", "SOLO", "open_tp_agreement", "all_pp_pairs"]


class TpAgreement:
    """The ready-count agreement of one stage's TP ranks (one gloo group with a timeout)."""

    def __init__(self, group: Any, ranks: Sequence[int], rank: int, timeout_s: float) -> None:
        self.group = group
        self.ranks = tuple(ranks)
        self.rank = rank
        self.timeout_s = timeout_s

    @property
    def size(self) -> int:
        return len(self.ranks)

    def ready(self, counts: Sequence[int], action: str) -> list[int]:
        """The element-wise minimum of ``counts`` over the stage's TP ranks."""
        if self.group is None:
            return list(counts)
        values = torch.tensor(list(counts), dtype=torch.int64)
        try:
            torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MIN, group=self.group)
        except RuntimeError as exc:  # gloo reports its timeout and a closed peer as RuntimeError
            raise CommTimeoutError(
                rank=self.rank, peer=list(self.ranks), group="vpp-tp", action=action, timeout_s=self.timeout_s,
                detail=f"the TP ranks {list(self.ranks)} of this stage did not all reach the agreement ({exc})",
                fix="a TP peer crashed or hangs: check the logs of the other TP ranks of this stage",
            ) from exc  # fmt: skip
        return [int(v) for v in values.tolist()]


SOLO = TpAgreement(group=None, ranks=(0,), rank=0, timeout_s=0.0)
"""``--tp-size 1``: every count is already agreed."""


def _gather(world_group: Any, mine: list[int]) -> list[list[int]]:
    everyone: list = [None] * torch.distributed.get_world_size(world_group)
    torch.distributed.all_gather_object(everyone, mine, group=world_group)
    return everyone


def open_tp_agreement(world_group: Any, tp_ranks: Sequence[int], timeout_s: float) -> TpAgreement:
    """Create a gloo group for every TP group (collective over the world: the same groups in the
    same order on every rank); return this rank's agreement."""
    groups = sorted({tuple(ranks) for ranks in _gather(world_group, list(tp_ranks))})
    mine = None
    for ranks in groups:
        group = torch.distributed.new_group(
            list(ranks), backend="gloo", timeout=datetime.timedelta(seconds=timeout_s)
        )
        if tuple(ranks) == tuple(tp_ranks):
            mine = group
    assert mine is not None, (tp_ranks, groups)
    return TpAgreement(mine, tp_ranks, torch.distributed.get_rank(), timeout_s)


def all_pp_pairs(world_group: Any, pp_ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The neighbour pairs of every pipeline (one per TP index), the same list on every rank.

    The communicator's groups are created collectively over the whole world, so each rank must
    name the links of the other TP indices' pipelines too (it holds only its own)."""
    pipelines = _gather(world_group, list(pp_ranks))
    return sorted({pair for ranks in pipelines for pair in zip(ranks, ranks[1:])})
