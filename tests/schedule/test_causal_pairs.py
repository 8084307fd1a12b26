"""``causal_pairs``: the one count of causal attention's query-key pairs, checked by hand."""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import ChunkSpec, LinearAttentionCost, attention_work, build_layout, causal_pairs


@pytest.mark.parametrize(("tokens", "prefix", "pairs"), [
    (1, 0, 1),          # one query sees itself
    (4, 0, 10),         # 1 + 2 + 3 + 4
    (3, 5, 21),         # 6 + 7 + 8
    (2, 1000, 2003),    # 1001 + 1002
])
def test_causal_pairs_by_hand(tokens, prefix, pairs):
    assert causal_pairs(tokens, prefix) == pairs
    assert causal_pairs(tokens, prefix) == sum(p + 1 for p in range(prefix, prefix + tokens))


def test_attention_work_sums_the_requests_of_a_batched_forward():
    forward = ChunkSpec(0, 0, 5, 3, batch=(ChunkSpec(1, 0, 0, 4, True),))
    assert attention_work(forward) == 21 + 10
    # The planner's estimate reads the same count: one layer, attention only.
    stage = build_layout(2, 2, "contiguous").stages[0]
    assert stage.num_layers == 1
    assert LinearAttentionCost(0.0, 1.0).stage_cost(stage, forward) == 31
