"""``Schedule``: the per-rank action streams of one plan, plus what is needed to read them.

``schedule_from_planner`` reads one off a planner; ``dry_run.build_schedule`` is the offline
entry point. Text and JSON forms live in ``text.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .controller import hand_off_groups
from .ir import Action, ChunkSpec, RequestSpec
from .layout import Layout
from .planner import Planner, TimelineEntry
from .policies import CommSemantics, Policy

__all__ = ["Schedule", "schedule_from_planner"]


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
    timeline: tuple[TimelineEntry, ...] = field(default=(), compare=False, repr=False)
    """Every compute as its executor reported it (a dry run: on the controller's estimate)."""

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


def schedule_from_planner(planner: Planner) -> Schedule:
    config = planner.config
    groups = hand_off_groups(planner.controller.num_groups)
    return Schedule(
        policy=config.policy.name,
        layout=config.layout,
        chunks=tuple(planner.sequence),
        rank_actions=tuple(tuple(planner.rank_actions(r)) for r in range(config.layout.num_ranks)),
        comm_semantics=config.policy.comm_semantics,
        groups=groups if config.layout.num_ranks > 1 else (),
        requests=tuple(planner.requests),
        timeline=tuple(planner.timeline),
    )
