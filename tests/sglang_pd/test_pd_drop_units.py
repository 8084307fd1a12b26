"""A decode server's refusal ends the request on its prefill server too (sglang_plugin/pd_drop.py),
without starting a server: the bootstrap server's POST route, the refused-room memory, the abort
on the TokenizerManager's loop, the prefill input guard, and the decode side's two callers."""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import threading
import types
import urllib.error
import urllib.request

import pytest

SKIP_NO_SGLANG = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")
pytestmark = SKIP_NO_SGLANG
WAIT_S = 30.0
"""Upper bound on a wait for another thread (never reached when the code works; no timing asserted)."""


@pytest.fixture
def pd_drop(monkeypatch):
    """The module with a fresh memory and no manager (another test's must not leak in)."""
    from sglang_vpp.sglang_plugin import pd_drop

    monkeypatch.setattr(pd_drop, "_refused", pd_drop.RefusedRooms())
    monkeypatch.setattr(pd_drop, "_manager", None)
    return pd_drop


class _State:
    def __init__(self, room, dispatched=True, finished=False):
        self.obj = types.SimpleNamespace(bootstrap_room=room)
        self.dispatched, self.finished = dispatched, finished


class _Manager:
    """What the drop reads of SGLang's TokenizerManager; records the calls and their threads."""

    def __init__(self, loop=None, states=None, mode="prefill"):
        self.server_args = types.SimpleNamespace(disaggregation_mode=mode, pp_size=1)
        self.model_config = types.SimpleNamespace(vocab_size=100)
        self.event_loop = loop
        self.rid_to_state = dict(states or {})
        self.calls: list[tuple] = []
        self.done = threading.Event()

    def abort_request(self, rid="", abort_all=False):
        self.calls.append(("abort_request", rid, threading.current_thread()))

    def _handle_abort_req(self, recv_obj):
        self.calls.append(("_handle_abort_req", recv_obj, threading.current_thread()))
        del self.rid_to_state[recv_obj.rid]
        self.done.set()


class _RecordingLoop:
    """An event loop stand-in that records what is scheduled on it, for the test to run."""

    def __init__(self):
        self.soon: list[tuple] = []
        self.later: list[tuple] = []

    def call_soon_threadsafe(self, fn, *args):
        self.soon.append((fn, args))

    def call_later(self, delay, fn, *args):
        self.later.append((delay, fn, args))


def _serve_routes(after_setup_routes):
    """SGLang's bootstrap server as far as the plugin's routes go: an aiohttp app on a thread and
    event loop of its own. Returns (port, stop)."""
    from aiohttp import web

    server = types.SimpleNamespace(app=web.Application(), attn_tp_size=2)
    after_setup_routes(None, server)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(server.app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, name="bootstrap", daemon=True)
    thread.start()

    def stop():
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(WAIT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(WAIT_S)

    return port, stop


def _post(port: int, path: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_route_refuses_a_bad_body_with_400_and_remembers_a_good_one(pd_drop):
    from sglang_vpp.sglang_plugin.pd_guard import after_setup_routes

    port, stop = _serve_routes(after_setup_routes)
    try:
        bad = [b"", b"not json", b"\xff\xfe", b"[1, 2]", b'{"reason": "x"}', b'{"room": -1, "reason": "x"}',
               b'{"room": 9223372036854775808, "reason": "x"}', b'{"room": true, "reason": "x"}',
               b'{"room": "7", "reason": "x"}', b'{"room": 7}', b'{"room": 7, "reason": ""}',
               b'{"room": 7, "reason": 3}']
        for data in bad:
            status, body = _post(port, pd_drop.DROP_ROUTE, data)
            assert status == 400 and body["error"], (data, status, body)
        assert len(pd_drop._refused) == 0
        status, body = _post(port, pd_drop.DROP_ROUTE, json.dumps({"room": 7, "reason": "page sizes differ"}).encode())
        assert (status, body) == (200, {"room": 7, "scheduled": False})  # no tokenizer has served yet
        assert pd_drop._refused.reason(7) == "page sizes differ"
    finally:
        stop()


def test_a_room_refusal_names_the_range_is_room_accepts(pd_drop):
    limit = pd_drop.ROOM_LIMIT
    for signed, low, text in ((False, 0, "[0, 2**63)"), (True, -limit, "[-2**63, 2**63)")):
        assert pd_drop.room_range(signed) == text
        assert pd_drop.is_room(low, signed) and pd_drop.is_room(limit - 1, signed)
        assert not pd_drop.is_room(low - 1, signed) and not pd_drop.is_room(limit, signed)
        assert not pd_drop.is_room(True, signed) and not pd_drop.is_room(float(low), signed)
    with pytest.raises(ValueError, match=r"room must be an integer in \[0, 2\*\*63\); got -1"):
        pd_drop.parse_drop({"room": -1, "reason": "x"})


def test_refused_rooms_are_bounded_in_count_and_time():
    from sglang_vpp.sglang_plugin.pd_drop import RefusedRooms

    rooms = RefusedRooms(ttl_s=10.0, max_rooms=3)
    for room in range(5):
        rooms.remember(room, f"reason {room}", now=100.0 + room)
    assert len(rooms) == 3 and rooms.reason(0, now=105.0) is None and rooms.reason(1, now=105.0) is None
    assert rooms.reason(4, now=105.0) == "reason 4"
    assert rooms.reason(2, now=112.0) is None and rooms.reason(3, now=112.0) == "reason 3"
    assert len(rooms) == 2
    rooms.remember(3, "again", now=120.0)  # refused again: its time starts over
    assert rooms.reason(3, now=129.0) == "again" and rooms.reason(4, now=129.0) is None
    assert rooms.reason(3, now=130.0) is None and len(rooms) == 0


def test_the_abort_runs_on_the_managers_loop_with_the_rid_of_the_room(pd_drop):
    """Posted on the bootstrap server's thread, the drop runs on the tokenizer's loop thread (its
    state and ZMQ sockets are that thread's): SGLang's abort_request of the room's rid (the
    scheduler frees the KV), then the client's answer: a 400 carrying the decode's reason. Other
    rooms, and a request already finished, are left alone."""
    from sglang_vpp.sglang_plugin.pd_guard import after_setup_routes

    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, name="tokenizer", daemon=True)
    loop_thread.start()
    manager = _Manager(loop, {"r-7": _State(7), "r-8": _State(8), "r-7-done": _State(7, finished=True)})
    pd_drop.remember_manager(manager)
    port, stop = _serve_routes(after_setup_routes)
    try:
        status, body = _post(port, pd_drop.DROP_ROUTE, json.dumps({"room": 7, "reason": "attn TP 2 vs 1"}).encode())
        assert (status, body) == (200, {"room": 7, "scheduled": True})
        assert manager.done.wait(WAIT_S)
    finally:
        stop()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(WAIT_S)
    assert [call[:2] for call in manager.calls[:1]] == [("abort_request", "r-7")]
    assert [call[0] for call in manager.calls] == ["abort_request", "_handle_abort_req"]
    assert all(call[2] is loop_thread for call in manager.calls)
    abort = manager.calls[1][1]
    assert abort.rid == "r-7"
    assert abort.finished_reason == {"type": "abort", "status_code": 400,
                                     "message": "the decode server refused this request: attn TP 2 vs 1"}
    assert set(manager.rid_to_state) == {"r-8", "r-7-done"}


def test_a_request_not_yet_dispatched_is_looked_for_again(pd_drop, monkeypatch):
    """Past the input guard but not yet sent to the scheduler, a request cannot be aborted there:
    the drop looks again later, then ends it; it gives up after RETRY_DELAYS_S."""
    monkeypatch.setattr(pd_drop, "RETRY_DELAYS_S", (0.2, 0.5))
    loop = _RecordingLoop()
    state = _State(7, dispatched=False)
    manager = _Manager(loop, {"r-7": state})
    pd_drop.remember_manager(manager)
    assert pd_drop.drop_room(7, "why")
    fn, args = loop.soon.pop()
    fn(*args)
    assert manager.calls == [] and [delay for delay, _, _ in loop.later] == [0.2]
    _, fn, args = loop.later.pop()
    fn(*args)  # still not dispatched: once more
    assert manager.calls == [] and [delay for delay, _, _ in loop.later] == [0.5]
    state.dispatched = True
    _, fn, args = loop.later.pop()
    fn(*args)
    assert [(name, getattr(obj, "rid", obj)) for name, obj, _ in manager.calls] == [
        ("abort_request", "r-7"), ("_handle_abort_req", "r-7")]
    manager = _Manager(loop, {"r-9": _State(9, dispatched=False)})
    pd_drop.remember_manager(manager)
    pd_drop.drop_room(9, "why")
    for _ in range(3):
        scheduled = loop.soon.pop() if loop.soon else loop.later.pop()[1:]
        scheduled[0](*scheduled[1])
    assert loop.soon == [] and loop.later == [] and manager.calls == []  # given up


def test_a_failing_drop_never_raises_into_the_loop(pd_drop):
    loop = _RecordingLoop()
    manager = _Manager(loop, {"r-7": _State(7)})

    def broken(rid="", abort_all=False):
        raise RuntimeError("zmq socket closed")

    manager.abort_request = broken
    pd_drop.remember_manager(manager)
    pd_drop.drop_room(7, "why")
    fn, args = loop.soon.pop()
    fn(*args)  # logged, not raised

    class Closed:
        def call_soon_threadsafe(self, *args):
            raise RuntimeError("Event loop is closed")

    pd_drop.remember_manager(_Manager(Closed()))
    assert pd_drop.drop_room(8, "why") is False and pd_drop._refused.reason(8) == "why"


def _request(room):
    """What the input guard reads of a GenerateReqInput, with ``room`` as its bootstrap room."""
    return types.SimpleNamespace(input_embeds=None, return_logprob=False, return_hidden_states=False,
                                 bootstrap_host=None, bootstrap_port=None, bootstrap_room=room)


def test_the_prefill_input_guard_refuses_a_remembered_room(pd_drop):
    """The router posts to both servers at once: the decode server's refusal may come first. A
    prefill server answers that room's request 400 with the reason; other rooms, and decode
    servers, are not concerned."""
    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.input_guard import check_request_tokens

    prefill = _Manager()
    pd_drop.drop_room(7, "page sizes differ")
    with pytest.raises(InputRejectedError, match="the decode server refused this request: page sizes differ"):
        check_request_tokens(prefill, _request(7), [1, 2])
    check_request_tokens(prefill, _request(8), [1, 2])
    check_request_tokens(prefill, _request(None), [1, 2])
    check_request_tokens(prefill, _request([7, 8]), [1, 2])  # a list: SGLang validates a batch item by item
    check_request_tokens(_Manager(mode="decode"), _request(7), [1, 2])
    assert pd_drop._manager is prefill  # the manager whose requests a drop ends


def test_a_room_is_forgotten_once_its_request_is_refused_or_ended(pd_drop):
    """The memory covers the race with the router's two posts, nothing more: a client that
    reuses the room afterwards (a retry once the servers are mended) is served."""
    from sglang_vpp.sglang_plugin.input_guard import check_request_tokens

    prefill = _Manager()
    pd_drop.drop_room(7, "page sizes differ")
    with pytest.raises(Exception, match="page sizes differ"):
        check_request_tokens(prefill, _request(7), [1, 2])
    check_request_tokens(prefill, _request(7), [1, 2])  # the retry

    loop = _RecordingLoop()
    manager = _Manager(loop, {"r-9": _State(9)})
    pd_drop.remember_manager(manager)
    pd_drop.drop_room(9, "why")
    fn, args = loop.soon.pop()
    fn(*args)
    assert [name for name, _, _ in manager.calls] == ["abort_request", "_handle_abort_req"]
    assert pd_drop._refused.reason(9) is None
    check_request_tokens(manager, _request(9), [1, 2])


def test_a_rid_that_starts_another_live_rid_is_not_aborted(pd_drop):
    """SGLang's scheduler aborts every request whose rid starts with the one given: with
    client-chosen rids "4" and "42", ending "4" would end "42" too, so "4" is left to the
    bootstrap timeout and nothing is aborted."""
    loop = _RecordingLoop()
    manager = _Manager(loop, {"4": _State(7), "42": _State(8)})
    pd_drop.remember_manager(manager)
    pd_drop.drop_room(7, "why")
    fn, args = loop.soon.pop()
    fn(*args)
    assert manager.calls == [] and set(manager.rid_to_state) == {"4", "42"}
    pd_drop.drop_room(8, "why")  # "42" starts no other rid: ended
    fn, args = loop.soon.pop()
    fn(*args)
    assert [(name, getattr(obj, "rid", obj)) for name, obj, _ in manager.calls] == [
        ("abort_request", "42"), ("_handle_abort_req", "42")]


class _Bootstrap(http.server.BaseHTTPRequestHandler):
    """A prefill's bootstrap server: healthy, page size 16, and it records the drops posted."""

    posts: list = []
    posted = threading.Event()
    route_status = 200

    def do_GET(self):  # noqa: N802 - the stdlib's name
        from sglang_vpp.sglang_plugin.pd_guard import ROUTE_QUERY

        if self.path in ("/health", ROUTE_QUERY):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps({"page_size": 16}).encode())
        else:
            self.send_response(404)
            self.end_headers()

    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts.append((self.path, body))
        self.send_response(self.route_status)
        self.end_headers()
        if len(type(self).posts) >= type(self).expected:
            type(self).posted.set()

    def log_message(self, *args):
        pass


@pytest.fixture
def bootstrap():
    handler = type("Handler", (_Bootstrap,), {"posts": [], "posted": threading.Event(), "expected": 1})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def test_the_decode_guard_tells_the_prefill_the_room_it_refused(bootstrap):
    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.pd_drop import DROP_ROUTE
    from sglang_vpp.sglang_plugin.pd_guard import check_bootstrap_address

    port, handler = bootstrap
    manager = types.SimpleNamespace(server_args=types.SimpleNamespace(disaggregation_mode="decode", page_size=1,
                                                                      device="cpu"))
    obj = types.SimpleNamespace(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=4242)
    with pytest.raises(InputRejectedError, match="--page-size 16") as refused:
        check_bootstrap_address(manager, obj)
    assert handler.posted.wait(WAIT_S)
    assert handler.posts == [(DROP_ROUTE, {"room": 4242, "reason": str(refused.value)})]


def test_the_decode_backstop_tells_the_prefill_each_failed_room(bootstrap):
    """pd_decode_refusal fails an address's requests in the decode scheduler; the prefill server
    behind that address (SGLang's "host:port") is told each room, from a thread of its own."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    from sglang_vpp.sglang_plugin.pd_decode_refusal import ensure_prefill_info_per_address
    from sglang_vpp.sglang_plugin.pd_drop import DROP_ROUTE

    port, handler = bootstrap
    handler.expected = 2
    addr = f"127.0.0.1:{port}"
    failures: dict = {}
    kv_manager = types.SimpleNamespace(record_failure=failures.__setitem__)

    def mismatch(queue, addr_to_reqs):
        raise RuntimeError("KV cache dtype mismatch")

    receiver = types.SimpleNamespace(abort=lambda: None)
    reqs = [types.SimpleNamespace(req=types.SimpleNamespace(bootstrap_room=room), kv_receiver=receiver)
            for room in (7, 8)]
    queue = object.__new__(DecodePreallocQueue)
    queue.kv_manager = kv_manager
    assert ensure_prefill_info_per_address(mismatch, queue, {addr: reqs}) == ({}, [])
    assert handler.posted.wait(WAIT_S)
    assert sorted(body["room"] for _, body in handler.posts) == [7, 8]
    assert all(path == DROP_ROUTE and "KV cache dtype mismatch" in body["reason"] and addr in body["reason"]
               for path, body in handler.posts)


def test_a_prefill_without_the_route_is_told_once_and_nothing_raises(bootstrap, pd_drop):
    port, handler = bootstrap
    handler.route_status = 404  # stock SGLang: no such route
    thread = pd_drop.tell_prefill(f"127.0.0.1:{port}", [1, 2, 3, "not a room", None], "why")
    thread.join(WAIT_S)
    assert not thread.is_alive() and [body["room"] for _, body in handler.posts] == [1]
    assert pd_drop.tell_prefill(f"127.0.0.1:{port}", [None], "why") is None
    closed = pd_drop.tell_prefill("127.0.0.1:1", [5], "why")  # nobody there: logged, not raised
    closed.join(WAIT_S)
    assert not closed.is_alive()


def _decode_process(tp_rank, pp_rank=0, attn_tp_size=1, attn_cp_rank=0):
    """One scheduler process of a decode server as the backstop sees it: its DecodePreallocQueue
    (global TP and PP rank, set to show they are not what decides) and that queue's KV manager (the ranks SGLang's CommonKVManager keeps,
    attention TP rank as SGLang derives it, and the failures it records)."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    queue = object.__new__(DecodePreallocQueue)
    queue.tp_rank, queue.pp_rank = tp_rank, pp_rank
    queue.kv_manager = types.SimpleNamespace(
        failures={}, pp_rank=pp_rank, attn_tp_rank=tp_rank % attn_tp_size, attn_cp_rank=attn_cp_rank,
        attn_dp_rank=tp_rank // attn_tp_size)
    queue.kv_manager.record_failure = queue.kv_manager.failures.__setitem__
    return queue


def _fail_on_mismatch(queue, addr, rooms):
    """The backstop on ``queue`` when SGLang's parallel-info check of ``addr`` raises; the decode
    requests of ``rooms`` it failed."""
    from sglang_vpp.sglang_plugin.pd_decode_refusal import ensure_prefill_info_per_address

    def mismatch(queue, addr_to_reqs):
        raise RuntimeError("KV cache dtype mismatch")

    reqs = [types.SimpleNamespace(req=types.SimpleNamespace(bootstrap_room=room),
                                  kv_receiver=types.SimpleNamespace(aborted=False)) for room in rooms]
    for decode_req in reqs:
        decode_req.kv_receiver.abort = lambda receiver=decode_req.kv_receiver: setattr(receiver, "aborted", True)
    assert ensure_prefill_info_per_address(mismatch, queue, {addr: reqs}) == ({}, [])
    return reqs


@pytest.fixture
def told(monkeypatch):
    """The (address, rooms) each tell_prefill call was given, in order; nothing posted."""
    from sglang_vpp.sglang_plugin import pd_drop

    calls: list = []
    monkeypatch.setattr(pd_drop, "tell_prefill", lambda address, rooms, reason: calls.append((address, list(rooms))))
    return calls


def test_a_decode_process_that_is_not_its_groups_receiver_fails_its_requests_and_posts_nothing(told):
    """Every scheduler process fails the rooms locally (its clients' errors come from its own
    receivers); only the receiver of the group's requests (PP 0, attention TP 0, attention CP 0)
    tells the prefill server."""
    addr = "127.0.0.1:8998"
    for queue in (_decode_process(tp_rank=1, attn_tp_size=2), _decode_process(tp_rank=0, pp_rank=1),
                  _decode_process(tp_rank=0, attn_cp_rank=1)):
        reqs = _fail_on_mismatch(queue, addr, [7, 8])
        assert all(decode_req.kv_receiver.aborted for decode_req in reqs)
        assert sorted(queue.kv_manager.failures) == [7, 8]
        assert all("KV cache dtype mismatch" in reason for reason in queue.kv_manager.failures.values())
    assert told == []


def test_a_decode_server_tells_the_prefill_each_room_once_per_group_of_ranks(told):
    """TP2 x PP2: four processes fail the same rooms; the prefill server is told once. Under DP
    attention (two groups of attention TP 2, each with rooms of its own), each group's receiver
    tells its rooms: the second one's is global TP rank 2, attention TP rank 0."""
    addr = "127.0.0.1:8998"
    for pp_rank in (0, 1):
        for tp_rank in (0, 1):
            _fail_on_mismatch(_decode_process(tp_rank, pp_rank, attn_tp_size=2), addr, [7, 8])
    assert told == [(addr, [7, 8])]

    told.clear()
    rooms_of_group = {0: [7], 1: [9, 10]}
    for tp_rank in range(4):
        queue = _decode_process(tp_rank, attn_tp_size=2)
        _fail_on_mismatch(queue, addr, rooms_of_group[queue.kv_manager.attn_dp_rank])
    assert told == [(addr, [7]), (addr, [9, 10])]


def test_a_kv_manager_without_ranks_tells_the_prefill(told):
    """A manager that is not a CommonKVManager keeps no ranks: it tells (a repeated post is harmless)."""
    queue = _decode_process(tp_rank=1, attn_tp_size=2)
    queue.kv_manager = types.SimpleNamespace(failures={})
    queue.kv_manager.record_failure = queue.kv_manager.failures.__setitem__
    _fail_on_mismatch(queue, "127.0.0.1:8998", [7])
    assert told == [("127.0.0.1:8998", [7])]


def test_the_backstop_logs_one_error_line_per_address_and_reason(told, caplog):
    """A mismatch repeats with each request of its address: its cause is logged once (pd_drop.LogOnce)."""
    import logging

    addr = "127.0.0.1:18998"  # an address no other test fails
    with caplog.at_level(logging.ERROR, logger="sglang_vpp.sglang_plugin.pd_decode_refusal"):
        for room in (7, 8):
            _fail_on_mismatch(_decode_process(tp_rank=0), addr, [room])
    lines = [record for record in caplog.records if addr in record.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR and "KV cache dtype mismatch" in lines[0].getMessage()


def test_only_the_process_that_tells_the_prefill_logs_the_error(told, caplog):
    """The group's other processes fail the same rooms for the same reason: a debug line each, so a
    TP 8 decode server says the cause once, not eight times."""
    import logging

    addr = "127.0.0.1:18999"  # an address no other test fails
    with caplog.at_level(logging.DEBUG, logger="sglang_vpp.sglang_plugin.pd_decode_refusal"):
        _fail_on_mismatch(_decode_process(tp_rank=1, attn_tp_size=2), addr, [9])
    lines = [record for record in caplog.records if addr in record.getMessage()]
    assert [record.levelno for record in lines] == [logging.DEBUG]


def _sglang_holds(room) -> bool:
    """Whether SGLang 0.5.23's prefill scheduler stores ``room`` without raising: a PP rank after
    the first replicates it to rank 0 (msgpack) when the request arrives, and every rank writes it
    into its metadata buffer with the last chunk's send (``MetadataBuffers.set_buf``)."""
    import queue

    import torch
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.pp_consensus_store import PPConsensusStore

    store = object.__new__(PPConsensusStore)
    store.__dict__.update(_pp_size=2, _pp_rank=1, _local_map={}, _cache_lock=threading.Lock(),
                          _replication_queue=queue.Queue())
    buffer = torch.zeros((1, 8), dtype=torch.uint64)  # MetadataBuffers.bootstrap_room off NPU
    try:
        store[room] = KVPoll.Bootstrapping
        buffer[0, 0] = room
    except (OverflowError, ValueError, RuntimeError):
        return False
    return True


def test_the_prefill_input_guard_refuses_a_room_its_scheduler_cannot_hold(pd_drop):
    """SGLang accepts any integer as a room; one its prefill scheduler cannot store raises there
    and ends the server. The prefill server's guard answers those 400, naming the range, and
    lets through every room SGLang holds."""
    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.input_guard import check_request_tokens

    prefill = _Manager()
    for room in (0, 7, 2**63 - 1, -1, -2**63):
        assert _sglang_holds(room)
        check_request_tokens(prefill, _request(room), [1, 2])
    for room in (2**63, 2**64 - 1, 2**64, -2**63 - 1):
        assert not _sglang_holds(room)
        with pytest.raises(InputRejectedError, match=r"bootstrap_room must be an integer in \[-2\*\*63, 2\*\*63\)"):
            check_request_tokens(prefill, _request(room), [1, 2])
    check_request_tokens(prefill, _request(None), [1, 2])  # SGLang's own 400
    check_request_tokens(prefill, _request([2**64]), [1, 2])  # a list: SGLang validates a batch item by item
    check_request_tokens(_Manager(mode="null"), _request(2**64), [1, 2])  # no split: SGLang ignores the room
