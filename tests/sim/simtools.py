"""Helpers for the simulator tests: schedules written as text, toy cost models."""

from __future__ import annotations



from sglang_vpp.schedule import (
    ChunkSpec,
    CommSemantics,
    RequestSpec,
    Schedule,
    StageCostModel,
    build_layout,
    parse_rank_lines,
)


class ConstCost(StageCostModel):
    """Every stage compute takes ``compute`` seconds, every hand-off ``transfer``."""

    def __init__(self, compute: float = 1.0, transfer: float = 0.0) -> None:
        self.compute, self.transfer = compute, transfer

    def stage_cost(self, stage, chunk):
        return self.compute

    def transfer_cost(self, stage, chunk):
        return self.transfer


class LinearTau(StageCostModel):
    """The method doc's law per layer: tau_k = (k + 1) t on a stage, scaled by its layer share
    (so a contiguous stage of 2 layers costs twice a fold-back stage of 1); ``uniform`` makes
    every chunk cost t. Communication is free."""

    def __init__(self, t: float = 1.0, uniform: bool = False) -> None:
        self.t, self.uniform = t, uniform

    def stage_cost(self, stage, chunk):
        growth = 1 if self.uniform else chunk.chunk_index + 1
        return self.t * growth * stage.num_layers


def text_schedule(lines: list[str], semantics: str, kind: str = "contiguous", num_chunks: int = 2,
                  chunk_tokens: int = 100, policy: str = "cpp") -> Schedule:
    """A hand-written schedule: one request of ``num_chunks`` chunks on a 2-rank layout."""
    num_ranks = len(lines)
    num_stages = num_ranks if kind == "contiguous" else 2 * num_ranks
    layout = build_layout(num_ranks, num_stages, kind)
    chunks = tuple(ChunkSpec(0, k, k * chunk_tokens, chunk_tokens, k == num_chunks - 1) for k in range(num_chunks))
    actions = tuple(tuple(a) for a in parse_rank_lines(lines))
    groups = sorted({a.group for rank in actions for a in rank if a.group})
    return Schedule(policy, layout, chunks, actions, CommSemantics(semantics), tuple(groups),
                    (RequestSpec(num_chunks * chunk_tokens),))


