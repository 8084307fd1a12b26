"""The TP agreement of the VPP loop (``tp_agreement.py``) on 4 gloo ranks, without a server:
TP groups {0, 1} and {2, 3}, pipelines {0, 2} and {1, 3} (SGLang's TP2 x PP2 rank order)."""

from __future__ import annotations

from pathlib import Path

from sglang_vpp.comm.launcher import run_ranks

HERE = str(Path(__file__).resolve().parent)
TP_GROUPS = ([0, 1], [2, 3])
PIPELINES = ([0, 2], [1, 3])


def agree(rank: int, world_size: int) -> dict:
    import torch

    from sglang_vpp.sglang_plugin.vpp.tp_agreement import all_pp_pairs, open_tp_agreement

    world = torch.distributed.group.WORLD
    pairs = all_pp_pairs(world, PIPELINES[rank % 2])
    agreement = open_tp_agreement(world, TP_GROUPS[rank // 2], timeout_s=20.0)
    # Messages arrive at different times on the two TP ranks of a stage: each holds a different count.
    first = agreement.ready([rank, 3 - rank % 2], "test")
    second = agreement.ready([5, 5], "test")
    return {"pairs": pairs, "first": first, "second": second, "ranks": list(agreement.ranks)}


def test_ranks_of_a_stage_see_the_minimum_and_every_rank_the_same_pairs():
    result = run_ranks("test_vpp_tp_agreement:agree", 4, sys_path=[HERE], timeout_s=120)
    result.raise_on_failure()
    values = result.values()
    for rank, value in enumerate(values):
        assert value["pairs"] == [(0, 2), (1, 3)], value
        assert value["ranks"] == TP_GROUPS[rank // 2]
        low = TP_GROUPS[rank // 2][0]
        assert value["first"] == [low, 2], value  # min over the stage's TP ranks, per entry
        assert value["second"] == [5, 5]


def dead_tp_peer(rank: int, world_size: int) -> dict:
    import os

    import torch

    from sglang_vpp.comm import CommTimeoutError
    from sglang_vpp.sglang_plugin.vpp.tp_agreement import open_tp_agreement

    agreement = open_tp_agreement(torch.distributed.group.WORLD, [0, 1], timeout_s=3.0)
    # One agreement while both live: gloo connects a group's mesh lazily, and a peer that exits
    # during that set-up makes rank 0 fail in the connect, not in the wait under test.
    agreement.ready([0], "the first choice")
    if rank == 1:
        os._exit(0)
    try:
        agreement.ready([1], "the follower's next message")
    except CommTimeoutError as error:
        return {"error": str(error)}
    return {"error": None}


def test_a_dead_tp_peer_is_a_clear_error_not_a_hang():
    result = run_ranks("test_vpp_tp_agreement:dead_tp_peer", 2, sys_path=[HERE], timeout_s=120)
    assert result.outcomes[0].ok, result.describe()
    message = result.outcomes[0].value["error"]
    assert message is not None and "vpp-tp" in message and "TP peer" in message, message
