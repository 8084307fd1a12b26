"""The VPP loop's transport adapter over ``sglang_vpp.comm``: message dicts, backend choice, and a
2-rank round trip on gloo through MessageLink / Inbox (no SGLang server)."""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_vpp.comm.launcher import run_ranks
from sglang_vpp.sglang_plugin.vpp.transport import GROUPS, MessageLink, Inbox, Message, backend_for, open_communicator

HERE = str(Path(__file__).resolve().parent)


def test_backend_follows_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "nccl"
    assert backend_for("npu:1") == "hccl"
    assert GROUPS == ("fwd", "bwd")


def test_message_dict_round_trip_pickles_events():
    events = [("reqs", [{1, 2}, object.__name__]), ("sched", 0, ("sig", 3)), ("idle",)]
    hidden = torch.randn(3, 4)
    message = Message(kind="step", seq=5, stage=0, events=events, tensors={"hidden_states": hidden})
    data = message.to_dict()
    assert data["events"].dtype == torch.uint8 and data["kind"] == "step"
    back = Message.from_dict(data)
    assert back.events == events and back.seq == 5 and back.stage == 0
    assert torch.equal(back.tensors["hidden_states"], hidden)
    assert "events" not in Message(kind="heartbeat").to_dict()


def round_trip(rank: int, world_size: int) -> dict:
    comm = open_communicator("cpu", [0, 1], timeout_s=20.0)
    inbox = Inbox(20.0)
    if rank == 0:
        out = MessageLink(comm=comm, direction="fwd", rank=0, peer=1, peer_rank=1, timeout_s=20.0)
        MessageLink(comm=comm, direction="bwd", rank=0, peer=1, peer_rank=1, timeout_s=20.0).start_pump(inbox)
        hidden = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        out.send(Message(kind="step", seq=0, stage=0, events=[("reqs", {"a": (1, 2)})],
                         tensors={"hidden_states": hidden}), blocking=False)
        out.send(Message(kind="heartbeat"), blocking=True)
        out.flush()
        got = []
        for _ in range(2):
            direction, handle = inbox.get(20.0)
            message = inbox.take(handle)
            got.append((direction, message.kind, message.seq, message.stage))
            if message.kind == "hidden":
                assert torch.equal(message.tensors["hidden_states"], hidden * 2)
        return {"got": got}
    out = MessageLink(comm=comm, direction="bwd", rank=1, peer=0, peer_rank=0, timeout_s=20.0)
    MessageLink(comm=comm, direction="fwd", rank=1, peer=0, peer_rank=0, timeout_s=20.0).start_pump(inbox)
    got = []
    for _ in range(2):
        direction, handle = inbox.get(20.0)
        message = inbox.take(handle)
        got.append((direction, message.kind, message.seq, message.events))
        if message.kind == "step":
            up = {"hidden_states": message.tensors["hidden_states"] * 2}
            out.send(Message(kind="hidden", seq=message.seq, stage=2, tensors=up), blocking=True)
        else:
            out.send(message, blocking=False)
    out.flush()
    return {"got": got}


def test_two_rank_round_trip_over_comm():
    result = run_ranks("test_vpp_transport:round_trip", 2, sys_path=[HERE], timeout_s=120)
    result.raise_on_failure()
    rank0, rank1 = result.values()
    assert rank1["got"] == [("fwd", "step", 0, [("reqs", {"a": (1, 2)})]), ("fwd", "heartbeat", -1, [])]
    assert rank0["got"] == [("bwd", "hidden", 0, 2), ("bwd", "heartbeat", -1, -1)]


def dead_peer(rank: int, world_size: int) -> dict:
    import os

    from sglang_vpp.comm import PeerDeadError

    comm = open_communicator("cpu", [0, 1], timeout_s=20.0)
    if rank == 1:
        os._exit(0)
    inbox = Inbox(20.0)
    MessageLink(comm=comm, direction="bwd", rank=0, peer=1, peer_rank=1, timeout_s=20.0).start_pump(inbox)
    direction, handle = inbox.get(20.0)
    try:
        inbox.take(handle)
    except PeerDeadError as error:
        return {"direction": direction, "error": str(error), "peer": error.peer, "group": error.group}
    return {"error": None}


def test_dead_peer_reaches_the_inbox_as_peer_dead_error():
    result = run_ranks("test_vpp_transport:dead_peer", 2, sys_path=[HERE], timeout_s=120)
    assert result.outcomes[0].ok, result.describe()  # rank 1 exits on purpose, without a result
    outcome = result.outcomes[0].value
    assert outcome["direction"] == "bwd" and outcome["peer"] == 1 and outcome["group"] == "bwd", outcome
