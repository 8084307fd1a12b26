"""Layer splits chosen for a cost curve: ``balance_split`` (``--balance auto``).

The fold-back balances ranks because, under a linear per-chunk cost ``tau_k = a + b k``, rank r
at distance d from the fold pairs chunk k+d with chunk k-d and ``tau_{k+d} + tau_{k-d} = 2 tau_k``.
When tau is not linear (DSA sparse attention: the attention part stops growing once the prefix
passes top-k, the indexer keeps growing slowly), that sum falls short of ``2 tau_k`` for the
ranks far from the fold, and they idle in step while the ranks at the fold still compute. Layers
of unequal cost (dense layers ahead of MoE ones) or a layer count that does not divide evenly
unbalance the ranks' total work as well. A layer split can only move total work between ranks:
it fixes the second kind fully and the first only as far as shifting work to the waiting ranks
helps.

``balance_split`` searches per-stage layer counts by greedy moves of one layer between adjacent
virtual stages, keeping a move only when the makespan of the dry run on the estimate (the same
``StageCostModel`` the controller orders work with) shrinks. It is deterministic, pure Python, and
only chooses the ``split`` that ``build_layout`` then uses: the planner's rules are unchanged.
"""

from __future__ import annotations

from typing import Sequence

from .cost import StageCostModel
from .factory import policy_layout
from .ir import RequestSpec
from .layout import Fold
from .policies import PolicySpec
from .dry_run import build_schedule

__all__ = ["BALANCE_MODES", "balance_split", "estimated_makespan"]

BALANCE_MODES = ("even", "auto")


def estimated_makespan(policy: PolicySpec, num_ranks: int, num_layers: int, requests: Sequence[RequestSpec],
                       chunk_size: int, cost: StageCostModel, split: Sequence[int] | None,
                       fold: Fold | str = Fold.SPLIT, batching: bool = False, partial_fill: bool | None = None) -> float:
    """End of the last compute of the dry run for this split (None: even); ``batching`` and
    ``partial_fill`` as the run it is chosen for batches short requests (``build_schedule``)."""
    schedule = build_schedule(policy, num_ranks, num_layers, list(requests), chunk_size,
                              None if split is None else list(split), cost, fold=fold, batching=batching,
                              partial_fill=partial_fill)
    return max((entry.end for entry in schedule.timeline), default=0.0)


def balance_split(policy: PolicySpec, num_ranks: int, num_layers: int, requests: Sequence[RequestSpec],
                  chunk_size: int, cost: StageCostModel, max_moves: int = 64,
                  fold: Fold | str = Fold.SPLIT, batching: bool = False,
                  partial_fill: bool | None = None) -> tuple[int, ...]:
    """Per-stage layer counts that shorten the estimated makespan (see the module docstring).

    Starts from the even split; each round tries every one-layer move between adjacent stages
    and applies the best one that helps by more than 0.01 %; stops when none does or after
    ``max_moves`` moves. ``batching``: whether the run this split is for batches short requests into
    one forward, and ``partial_fill`` whether its batches start the request that overflows them; the
    split is scored on the plan that run makes.
    """
    # The layout says how many stages there are (and refuses too few layers).
    layout = policy_layout(policy, num_ranks, num_layers, None, fold)
    num_stages = layout.num_stages
    split = [stage.num_layers for stage in layout.stages]

    def score(candidate: Sequence[int]) -> float:
        return estimated_makespan(policy, num_ranks, num_layers, requests, chunk_size, cost, candidate, fold,
                                  batching, partial_fill)

    best = score(split)
    for _ in range(max_moves):
        candidates = []
        for i in range(num_stages - 1):
            for source, target in ((i, i + 1), (i + 1, i)):
                if split[source] > 1:
                    moved = list(split)
                    moved[source] -= 1
                    moved[target] += 1
                    candidates.append(moved)
        if not candidates:  # one layer per stage: the only split there is
            break
        scored = [(score(c), c) for c in candidates]
        value, choice = min(scored, key=lambda item: item[0])
        if value >= best * (1 - 1e-4):
            break
        best, split = value, choice
    return tuple(split)
