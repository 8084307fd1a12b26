"""Channel and Communicator mechanics on an in-process fake link (no processes, fast).

``FakeLink`` pairs two ends in one process with rendezvous semantics: a send finishes only when
the peer's receive took the message, as gloo, NCCL and HCCL do. That is enough to check issue
order, pipelining of consecutive sends, receive look-ahead, the dual-group escape from the
single-group deadlock, error location, broken channels, close, ``wait_any`` and the alias check.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import pytest
import torch

from sglang_vpp.comm.base import CommBackend, Link, LinkSpec, OpKind
from sglang_vpp.comm.channel import Channel
from sglang_vpp.comm.communicator import Communicator
from sglang_vpp.comm.config import CommConfig
from sglang_vpp.comm.errors import (
    CommClosedError,
    CommConfigError,
    CommProtocolError,
    CommTimeoutError,
    CommunicatorAliasError,
    PeerDeadError,
    TensorDictError,
)
from sglang_vpp.comm.message import decode_header


class _Pipe:
    """One direction of a fake communicator: messages in flight, and a condition to wait on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: deque[tuple[Any, threading.Event]] = deque()


class FakeLink(Link):
    def __init__(self, spec: LinkSpec, rank: int, outbox: _Pipe, inbox: _Pipe, comm_id: str = "") -> None:
        self.spec, self.rank = spec, rank
        self.outbox, self.inbox = outbox, inbox
        self.comm_id = comm_id or f"fake:{spec}"
        self.log: list[str] = []
        self.fail_next_recv: Exception | None = None
        self.tamper_seq = False

    def communicator_id(self) -> str:
        return self.comm_id

    def post_send(self, message: Any) -> Any:
        self.log.append(f"post{message.seq}")
        taken = threading.Event()
        with self.outbox.cond:
            self.outbox.items.append((message, taken))
            self.outbox.cond.notify_all()
        return message.seq, taken

    def finish_send(self, token: Any, deadline: float) -> None:
        seq, taken = token
        if not taken.wait(max(0.0, deadline - time.monotonic())):
            raise CommTimeoutError(detail="fake transport: receive never posted")
        self.log.append(f"done{seq}")

    def recv(self, deadline: float, upcoming: int = 0) -> Any:
        self.log.append(f"recv(upcoming={upcoming})")
        if self.fail_next_recv is not None:
            failure, self.fail_next_recv = self.fail_next_recv, None
            raise failure
        with self.inbox.cond:
            if not self.inbox.cond.wait_for(lambda: self.inbox.items, max(0.0, deadline - time.monotonic())):
                raise CommTimeoutError(detail="fake transport: nothing arrived")
            message, taken = self.inbox.items.popleft()
        taken.set()
        header = decode_header(message.header)
        if self.tamper_seq:
            header.seq += 5
        return header, header.assemble([p.clone() for p in message.payloads])

    def exchange(self, message: Any, deadline: float) -> Any:
        token = self.post_send(message)
        result = self.recv(deadline)
        self.finish_send(token, deadline)
        return result


def fake_pair(group: str = "fwd", comm_id: str = "") -> tuple[FakeLink, FakeLink]:
    a_to_b, b_to_a = _Pipe(), _Pipe()
    spec = LinkSpec(group, (0, 1))
    return FakeLink(spec, 0, a_to_b, b_to_a, comm_id), FakeLink(spec, 1, b_to_a, a_to_b, comm_id)


def channels(links: tuple[FakeLink, FakeLink], timeout: float = 2.0, transport: float = 3.0) -> tuple[Channel, Channel]:
    def make(link: FakeLink) -> Channel:
        return Channel(link, transport_timeout_s=transport, default_timeout_s=timeout, notify=lambda: None)

    return make(links[0]), make(links[1])


def test_messages_arrive_in_order_with_contents() -> None:
    c0, c1 = channels(fake_pair())
    sends = [c0.submit(OpKind.SEND, {"i": i, "x": torch.full((i % 3 + 1,), float(i))}, None) for i in range(50)]
    recvs = [c1.submit(OpKind.RECV, None, None) for _ in range(50)]
    for i, handle in enumerate(recvs):
        got = handle.wait()
        assert got["i"] == i and torch.equal(got["x"], torch.full((i % 3 + 1,), float(i)))
    assert all(h.wait() is None for h in sends)
    c0.stop(), c1.stop()


def test_consecutive_sends_are_posted_before_the_first_finishes() -> None:
    links = fake_pair()
    c0, c1 = channels(links)
    gate = threading.Event()
    # Hold the channel thread with a receive that completes only when we allow it.
    c0_recv = c0.submit(OpKind.RECV, None, "hold")
    sends = [c0.submit(OpKind.SEND, {"i": i}, None) for i in range(5)]
    threading.Timer(0.2, gate.set).start()
    gate.wait()
    c1.submit(OpKind.SEND, {"go": 1}, None).wait()
    c0_recv.wait()
    for _ in range(5):
        c1.submit(OpKind.RECV, None, None).wait()
    for handle in sends:
        handle.wait()
    log = links[0].log
    first_done = log.index("done0")
    assert {f"post{i}" for i in range(5)} <= set(log[:first_done]), log
    c0.stop(), c1.stop()


def test_each_send_of_a_run_completes_when_it_pairs() -> None:
    c0, c1 = channels(fake_pair())
    hold = c0.submit(OpKind.RECV, None, "hold")  # queue the sends behind it so they form one run
    sends = [c0.submit(OpKind.SEND, {"i": i}, None) for i in range(3)]
    c1.submit(OpKind.SEND, {"go": 1}, None)
    hold.wait()
    assert c1.submit(OpKind.RECV, None, None).wait() == {"i": 0}
    sends[0].wait(2.0)
    time.sleep(0.1)
    assert sends[0].is_ready() and not sends[1].is_ready() and not sends[2].is_ready()
    for i in (1, 2):
        assert c1.submit(OpKind.RECV, None, None).wait() == {"i": i}
    assert all(h.wait() is None for h in sends)
    c0.stop(), c1.stop()


def test_receive_lookahead_counts_only_consecutive_receives() -> None:
    links = fake_pair()
    c0, c1 = channels(links)
    ops = [c0.submit(OpKind.RECV, None, None) for _ in range(3)] + [c0.submit(OpKind.SEND, {"s": 1}, None)] \
        + [c0.submit(OpKind.RECV, None, None)]
    for i in range(3):
        c1.submit(OpKind.SEND, {"i": i}, None)
    c1.submit(OpKind.RECV, None, None)
    c1.submit(OpKind.SEND, {"i": 3}, None)
    for handle in ops:
        handle.wait()
    recv_calls = [entry for entry in links[0].log if entry.startswith("recv")]
    # The first receive may have been taken before the rest were queued; the look-ahead never
    # reaches past the queued send.
    assert recv_calls[-1] == "recv(upcoming=0)"
    assert all(int(call.split("=")[1][:-1]) <= 2 for call in recv_calls), recv_calls
    c0.stop(), c1.stop()


def test_single_communicator_blocking_pattern_times_out_and_two_groups_do_not() -> None:
    # One communicator: both ends send first, then receive. Rendezvous semantics: stuck.
    c0, c1 = channels(fake_pair("pp"), timeout=0.3, transport=1.5)
    started = time.monotonic()
    handles = [c.submit(OpKind.SEND, {"x": torch.ones(2)}, f"{c.rank}SEND_F0.0>{c.peer}@pp") for c in (c0, c1)]
    for handle in handles:
        with pytest.raises(CommTimeoutError) as info:
            handle.wait()
        assert info.value.action == handle.action and info.value.group == "pp" and info.value.timeout_s == 0.3
        assert "has not posted the matching receive" in str(info.value)
    assert time.monotonic() - started < 1.0
    # Two communicators, one per direction: the same program completes.
    f0, f1 = channels(fake_pair("fwd"))
    b0, b1 = channels(fake_pair("bwd"))
    s0 = f0.submit(OpKind.SEND, {"x": torch.ones(2)}, None)
    s1 = b1.submit(OpKind.SEND, {"x": torch.zeros(2)}, None)
    assert torch.equal(f1.submit(OpKind.RECV, None, None).wait()["x"], torch.ones(2))
    assert torch.equal(b0.submit(OpKind.RECV, None, None).wait()["x"], torch.zeros(2))
    s0.wait(), s1.wait()
    for c in (c0, c1, f0, f1, b0, b1):
        c.stop()


def test_transport_failure_is_located_and_breaks_the_channel() -> None:
    links = fake_pair()
    c0, c1 = channels(links)
    links[0].fail_next_recv = PeerDeadError(detail="fake: peer vanished")
    first = c0.submit(OpKind.RECV, None, "2RECV_F0.3<1@fwd")
    second = c0.submit(OpKind.SEND, {"x": 1}, "0SEND_F0.4>1@fwd")
    with pytest.raises(PeerDeadError) as info:
        first.wait()
    assert (info.value.rank, info.value.peer, info.value.group, info.value.action) == (0, 1, "fwd", "2RECV_F0.3<1@fwd")
    with pytest.raises(PeerDeadError) as later:
        second.wait()
    assert later.value.action == "0SEND_F0.4>1@fwd" and "earlier operation" in str(later.value)
    assert c0.broken is not None
    c0.stop(), c1.stop()


def test_reordered_message_is_a_protocol_error() -> None:
    links = fake_pair()
    c0, c1 = channels(links)
    links[1].tamper_seq = True
    c0.submit(OpKind.SEND, {"x": 1}, None)
    with pytest.raises(CommProtocolError, match="expected message #0"):
        c1.submit(OpKind.RECV, None, None).wait()
    c0.stop(), c1.stop()


def test_bad_message_raises_in_the_caller_and_queues_nothing() -> None:
    c0, c1 = channels(fake_pair())
    with pytest.raises(TensorDictError, match="tuple"):
        c0.submit(OpKind.SEND, {"meta": (1, 2)}, None)
    c0.submit(OpKind.SEND, {"ok": 1}, None)
    assert c1.submit(OpKind.RECV, None, None).wait() == {"ok": 1}  # numbering unaffected
    c0.stop(), c1.stop()


def test_stop_fails_queued_and_running_operations() -> None:
    c0, c1 = channels(fake_pair(), timeout=0.2, transport=0.5)
    running = c0.submit(OpKind.RECV, None, "a")
    queued = c0.submit(OpKind.RECV, None, "b")
    time.sleep(0.05)
    c0.stop()
    for handle in (running, queued):
        assert handle.is_ready()
        assert isinstance(handle.exception(), CommClosedError)
    with pytest.raises(CommClosedError):
        c0.submit(OpKind.SEND, {"x": 1}, None)
    assert c0.join(2.0)
    c1.stop()


def test_handle_readiness_and_callbacks() -> None:
    c0, c1 = channels(fake_pair())
    recv = c1.submit(OpKind.RECV, None, None)
    seen: list[str] = []
    recv.add_done_callback(lambda h: seen.append(h.action))
    assert not recv.is_ready() and recv.exception() is None
    with pytest.raises(CommTimeoutError, match="in flight"):
        recv.wait(0.05)  # a timed-out wait does not cancel
    c0.submit(OpKind.SEND, {"v": 7}, None)
    assert recv.wait() == {"v": 7} and recv.is_ready() and seen == [recv.action]
    late: list[str] = []
    recv.add_done_callback(lambda h: late.append("now"))
    assert late == ["now"]
    c0.stop(), c1.stop()


class _Backend(CommBackend):
    name = "fake"
    distribution = "tests"

    @classmethod
    def probe(cls) -> Any:
        raise NotImplementedError

    def open_link(self, spec: LinkSpec, rank: int, timeout_s: float) -> Link | None:
        raise NotImplementedError


def _communicator(links: dict[tuple[str, int], Link], timeout: float = 1.0) -> Communicator:
    return Communicator(_Backend(), 0, 2, CommConfig(timeout_s=timeout), links, list(links.values()))


def test_wait_any_returns_the_ready_subset_and_times_out_naming_an_operation() -> None:
    fwd, bwd = fake_pair("fwd"), fake_pair("bwd")
    rank0 = _communicator({("fwd", 1): fwd[0], ("bwd", 1): bwd[0]})
    rank1 = _communicator({("fwd", 0): fwd[1], ("bwd", 0): bwd[1]})
    rank1.rank = 1
    a = rank0.irecv(1, "bwd", action="2RECV_F0.0<1@bwd")
    b = rank0.irecv(1, "bwd", action="2RECV_F0.1<1@bwd")
    with pytest.raises(CommTimeoutError) as info:
        rank0.wait_any([a, b], timeout_s=0.1)
    assert info.value.action == "2RECV_F0.0<1@bwd" and "none of 2" in str(info.value)
    rank1.isend({"k": 1}, 0, "bwd")
    assert rank0.wait_any([a, b], timeout_s=2.0) == [a]
    with pytest.raises(CommConfigError, match="no link on group 'pp'"):
        rank0.isend({"x": 1}, 1, "pp")
    rank0.close(drain=False)
    rank1.close(drain=False)
    assert b.is_ready() and isinstance(b.exception(), CommClosedError)


def test_alias_check_names_both_groups() -> None:
    fwd, bwd = fake_pair("fwd", comm_id="hccl:vpp_same"), fake_pair("bwd", comm_id="hccl:vpp_same")
    comm = _communicator({("fwd", 1): fwd[0], ("bwd", 1): bwd[0]})
    with pytest.raises(CommunicatorAliasError) as info:
        comm.check_distinct()
    assert "'fwd' and 'bwd'" in str(info.value) and info.value.peer == 1
    comm.close(drain=False)


def test_close_never_raises_and_is_idempotent() -> None:
    links = fake_pair()
    comm = _communicator({("fwd", 1): links[0]}, timeout=0.2)
    pending = comm.isend({"x": 1}, 1, "fwd")  # the peer never receives
    started = time.monotonic()
    comm.close(timeout_s=0.2)
    comm.close()
    assert time.monotonic() - started < 2.0
    assert isinstance(pending.exception(), CommClosedError)


def test_schedule_walk_surfaces_a_send_that_fails_while_it_reaps_finished_sends() -> None:
    """The walk reaps finished asynchronous sends every 64; a send that fails between its look at
    which handles are ready and its cut of the pending list must still raise, not be dropped."""
    from types import SimpleNamespace

    from sglang_vpp.comm.testing.schedule_walk import walk_rank
    from sglang_vpp.schedule import ActionKind

    failure = PeerDeadError(rank=0, peer=1, group="fwd", action="late", detail="the peer died")

    class Handle:
        def __init__(self, late: bool) -> None:
            self.late, self.failed = late, False

        def is_ready(self) -> bool:
            if self.late and not self.failed:
                self.failed = True  # it fails right after this first look
                return False
            return True

        def exception(self):
            return failure if self.failed else None

        def wait(self, timeout_s=None):
            if self.exception() is not None:
                raise failure
            return None

    class Comm:
        rank = 0

        def __init__(self) -> None:
            self.sent = 0

        def isend(self, tensors, dst, group, *, action=None):
            self.sent += 1
            return Handle(late=self.sent == 64)

    def action(kind, chunk):
        return SimpleNamespace(kind=kind, stage_index=0, request_index=0, chunk_index=chunk,
                               group="fwd" if kind is ActionKind.SEND else None, peer=1)

    actions = [action(kind, chunk) for chunk in range(64) for kind in (ActionKind.COMPUTE, ActionKind.SEND)]
    with pytest.raises(PeerDeadError):
        walk_rank(Comm(), actions)


def test_a_failure_reported_again_keeps_its_class_and_state_with_a_new_action_and_rank():
    """``with_action``: a later operation on a broken channel, or a failure classified before its
    rank was known (the runtime's start-of-run barrier), keeps the class, peer, group, detail
    and fix; only the action, and the rank when given, change."""
    failure = PeerDeadError(rank=0, peer=1, group="fwd", action="recv", detail="gone", fix="restart")
    again = failure.with_action("the start-of-run barrier", detail_prefix="torn: ", rank=3)
    assert type(again) is PeerDeadError
    assert (again.rank, again.peer, again.group, again.action) == (3, 1, "fwd", "the start-of-run barrier")
    assert (again.detail, again.fix) == ("torn: gone", "restart")
    assert failure.with_action("send").rank == 0


def test_one_default_comm_timeout_for_the_communicator_the_runtime_and_bench():
    """``COMM_TIMEOUT_S`` is the default of ``CommConfig``, of the runtime's ``Timeouts`` and of
    ``bench --timeout``, and the example of ``CommConfig``'s refusal."""
    import typer.main

    from sglang_vpp.cli.app import app
    from sglang_vpp.comm import COMM_TIMEOUT_S
    from sglang_vpp.timeouts import COMM_TIMEOUT_S as defined
    from sglang_vpp.runtime.spec import Timeouts

    assert COMM_TIMEOUT_S is defined
    params = {param.name: param for param in typer.main.get_command(app).commands["bench"].params}
    assert CommConfig().timeout_s == Timeouts().comm_s == params["timeout"].default == COMM_TIMEOUT_S
    with pytest.raises(CommConfigError, match=f"e.g. {COMM_TIMEOUT_S:g}\\.$"):
        CommConfig(timeout_s=0)
