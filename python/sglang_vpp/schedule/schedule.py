"""``Schedule``: the per-rank action streams of one plan, plus what is needed to read them.

``build_schedule`` is the offline entry point: layout, then the controller configuration of
``factory.py``, then the planner run to completion. Text and JSON forms live in ``text.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .chunking import Chunker
from .controller import hand_off_groups
from .cost import StageCostModel
from .factory import controller_config, policy_layout
from .ir import Action, ChunkSpec, RequestSpec
from .layout import Fold, Layout
from .planner import Planner, TimelineEntry
from .policies import CommSemantics, Policy, PolicySpec, get_policy

__all__ = ["Schedule", "build_schedule", "schedule_from_planner"]


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions for one policy on one layout."""

    policy: Policy
    layout: Layout
    chunks: tuple[ChunkSpec, ...]
    rank_actions: tuple[tuple[Action, ...], ...]
    comm_semantics: CommSemantics
    groups: tuple[str, ...]
    requests: tuple[RequestSpec, ...] = ()
    estimated_timeline: tuple[TimelineEntry, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        assert len(self.rank_actions) == self.layout.num_ranks

    @property
    def num_ranks(self) -> int:
        return self.layout.num_ranks

    @property
    def num_actions(self) -> int:
        return sum(len(actions) for actions in self.rank_actions)

    def chunk(self, request_index: int, chunk_index: int) -> ChunkSpec:
        return self._chunk_index()[(request_index, chunk_index)]

    def _chunk_index(self) -> dict[tuple[int, int], ChunkSpec]:
        cache = self.__dict__.get("_chunks_by_key")
        if cache is None:
            cache = {c.key: c for c in self.chunks}
            object.__setattr__(self, "_chunks_by_key", cache)
        return cache


def build_schedule(
    policy: str | Policy | PolicySpec,
    num_ranks: int,
    num_layers: int,
    requests: Sequence[RequestSpec | int],
    chunk_size: int,
    split: Sequence[int] | None = None,
    cost: StageCostModel | None = None,
    chunker: Chunker | None = None,
    num_groups: int | None = None,
    max_in_flight: int | None = None,
    batching: bool = False,
    fold: Fold | str = Fold.SPLIT,
) -> Schedule:
    """Plan ``requests`` (lengths or ``RequestSpec``) end to end for one policy. ``batching``
    off by default: one request per forward, the reference runtime's ``--no-batch-requests``
    (``factory.controller_config``); the runtime's default batches, as ``batching=True`` plans.
    ``fold``: a fold-back mode's fold (``factory.policy_layout``)."""
    spec = policy if isinstance(policy, PolicySpec) else get_policy(policy)
    layout = policy_layout(spec, num_ranks, num_layers, split, fold)
    specs = [r if isinstance(r, RequestSpec) else RequestSpec(int(r)) for r in requests]
    config = controller_config(spec, layout, chunk_size, cost, max((r.length for r in specs), default=1),
                               batching=batching, max_in_flight=max_in_flight, num_groups=num_groups,
                               chunker=chunker)
    planner = Planner(config)
    for request in specs:
        planner.submit(request)
    planner.advance()
    return schedule_from_planner(planner)


def schedule_from_planner(planner: Planner) -> Schedule:
    config = planner.config
    groups = hand_off_groups(config.groups)
    return Schedule(
        policy=config.policy.name,
        layout=config.layout,
        chunks=tuple(planner.sequence),
        rank_actions=tuple(tuple(planner.rank_actions(r)) for r in range(config.layout.num_ranks)),
        comm_semantics=config.policy.comm_semantics,
        groups=groups if config.layout.num_ranks > 1 else (),
        requests=tuple(planner.requests),
        estimated_timeline=tuple(planner.timeline),
    )
