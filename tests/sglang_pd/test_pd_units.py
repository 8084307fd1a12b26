"""The CPU guards of a prefill-decode server (cpu_compat), without starting a server."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from sglang_vpp.sglang_plugin.cpu_compat import _sender_without_host_indices, apply_cpu_pd_args

SKIP_NO_SGLANG = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang is not installed")


def _ns(**kwargs) -> argparse.Namespace:
    base = dict(device="cpu", disaggregation_mode="null", disaggregation_decode_retraction_backup=None,
                disable_overlap_schedule=False)
    base.update(kwargs)
    return argparse.Namespace(**base)


def test_cpu_decode_defaults_retraction_backup_to_none():
    args = _ns(disaggregation_mode="decode")
    assert apply_cpu_pd_args(args) == ["--disaggregation-decode-retraction-backup none"]
    assert args.disaggregation_decode_retraction_backup == "none"
    assert args.disable_overlap_schedule is False


def test_cpu_prefill_turns_the_overlap_schedule_off():
    args = _ns(disaggregation_mode="prefill")
    assert apply_cpu_pd_args(args) == ["--disable-overlap-schedule"]
    assert args.disable_overlap_schedule is True


def test_user_choice_kept_and_other_devices_untouched():
    kept = _ns(disaggregation_mode="decode", disaggregation_decode_retraction_backup="cpu_tensor")
    assert apply_cpu_pd_args(kept) == [] and kept.disaggregation_decode_retraction_backup == "cpu_tensor"
    for device in ("cuda", "npu", None):
        args = _ns(device=device, disaggregation_mode="prefill")
        assert apply_cpu_pd_args(args) == [] and args.disable_overlap_schedule is False
    assert apply_cpu_pd_args(_ns()) == []


def test_sender_hook_shadows_the_class_flag():
    class Sender:
        supports_host_tensor_indices = True

        def __init__(self, value):
            self.value = value

    sender = Sender.__new__(Sender)
    _sender_without_host_indices(Sender.__init__, sender, 3)
    assert sender.value == 3 and sender.supports_host_tensor_indices is False
    assert Sender.supports_host_tensor_indices is True


@SKIP_NO_SGLANG
@pytest.mark.slow
def test_sender_hook_applies_on_cpu_prefill_only():
    """In a fresh process (the hook patches SGLang's class): a cpu prefill registers and applies
    it (require_applied passes), a cuda prefill or a cpu decode registers nothing."""
    code = textwrap.dedent("""
        import types
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang_vpp.sglang_plugin import cpu_compat
        from sglang_vpp.sglang_plugin.hook_targets import require_applied
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender
        assert "__init__" not in vars(MooncakeKVSender)  # inherited until the hook wraps it
        ns = types.SimpleNamespace
        assert not cpu_compat.register_cpu_pd_hooks(ns(device="cuda", disaggregation_mode="prefill"))
        assert not cpu_compat.register_cpu_pd_hooks(ns(device="cpu", disaggregation_mode="decode"))
        assert cpu_compat.register_cpu_pd_hooks(ns(device="cpu", disaggregation_mode="prefill"))
        HookRegistry.apply_hooks()
        require_applied(cpu_compat.PD_SENDER_INIT_TARGET)
        assert "__init__" in vars(MooncakeKVSender)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def _decode_manager(mode: str = "decode"):
    import types

    return types.SimpleNamespace(server_args=types.SimpleNamespace(disaggregation_mode=mode))


def _request(host, port, room=5):
    import types

    return types.SimpleNamespace(bootstrap_host=host, bootstrap_port=port, bootstrap_room=room)


@SKIP_NO_SGLANG
def test_bootstrap_guard_refuses_unreachable_and_bad_values():
    import socket

    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.pd_guard import check_bootstrap_address

    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_bootstrap_address(_decode_manager(), _request("127.0.0.1", server.server_address[1]))
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as silent:  # accepts connections, never answers: what a proxy may do
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent_port = silent.getsockname()[1]
        with pytest.raises(InputRejectedError, match=f"127.0.0.1:{silent_port} is unreachable"):
            check_bootstrap_address(_decode_manager(), _request("127.0.0.1", silent_port))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(InputRejectedError, match=f"127.0.0.1:{closed_port} is unreachable"):
            check_bootstrap_address(_decode_manager(), _request("127.0.0.1", closed_port))
    with socket.socket() as other:  # another service on the port: its answer is not HTTP
        other.bind(("127.0.0.1", 0))
        other.listen()
        other_port = other.getsockname()[1]

        def answer_once() -> None:
            conn, _ = other.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-not-http\r\n")

        threading.Thread(target=answer_once, daemon=True).start()
        with pytest.raises(InputRejectedError, match=f"127.0.0.1:{other_port} is unreachable"):
            check_bootstrap_address(_decode_manager(), _request("127.0.0.1", other_port))
    for port_value in (0, 70000, "8998"):
        with pytest.raises(InputRejectedError, match="bootstrap_port must be a TCP port"):
            check_bootstrap_address(_decode_manager(), _request("127.0.0.1", port_value))
    for room in (-1, 2**63, "7"):
        with pytest.raises(InputRejectedError, match="bootstrap_room must be an integer"):
            check_bootstrap_address(_decode_manager(), _request("127.0.0.1", 1, room))


@SKIP_NO_SGLANG
def test_bootstrap_guard_refuses_a_prefill_server_of_another_page_size():
    """SGLang's own page-size check raises in the decode scheduler and ends the decode server
    (seen with a --page-size 16 VPP prefill behind a page-size-1 decode): the guard answers 400
    instead. A bootstrap server still registering (503) is asked again on the next request."""
    import http.server
    import json
    import threading
    import types

    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.pd_guard import ROUTE_QUERY, check_bootstrap_address

    answer = {"status": 503, "page_size": 16}

    class Bootstrap(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path == "/health":
                self.send_response(200)
                self.end_headers()
            elif self.path == ROUTE_QUERY:
                self.send_response(answer["status"])
                self.end_headers()
                self.wfile.write(json.dumps({"page_size": answer["page_size"], "pp_size": 2}).encode())
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args):
            pass

    def manager(page_size, device="cuda"):
        return types.SimpleNamespace(server_args=types.SimpleNamespace(disaggregation_mode="decode",
                                                                       page_size=page_size, device=device))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bootstrap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        check_bootstrap_address(manager(1), _request("127.0.0.1", port))  # registering: not judged yet
        answer["status"] = 200
        with pytest.raises(InputRejectedError, match="runs --page-size 16 but this decode server runs --page-size 1"):
            check_bootstrap_address(manager(1), _request("127.0.0.1", port))
        with pytest.raises(InputRejectedError, match="runs --page-size 16 but this decode server runs --page-size 1"):
            check_bootstrap_address(manager(None, "cpu"), _request("127.0.0.1", port))  # unset on CPU: 1
        check_bootstrap_address(manager(None), _request("127.0.0.1", port))  # unknown here: SGLang decides
        check_bootstrap_address(manager(16), _request("127.0.0.1", port))
    finally:
        server.shutdown()
        server.server_close()


@SKIP_NO_SGLANG
def test_bootstrap_guard_refuses_a_vpp_prefill_of_another_attention_tp(monkeypatch):
    """A VPP prefill on the CPU fails every transfer to a decode server of another attention TP
    size, and Mooncake then marks the decode session failed: the guard answers 400 instead, before
    a session exists, from what the prefill's bootstrap server says on the plugin's route; a
    prefill that does not refuse (or has no such route), the same size, or an MLA model pass."""
    import http.server
    import json
    import threading
    import types

    from sglang.srt.configs.model_config import AttentionArch

    from sglang_vpp.sglang_plugin.errors import InputRejectedError
    from sglang_vpp.sglang_plugin.pd_guard import PLUGIN_ROUTE, check_bootstrap_address

    from sglang_vpp.sglang_plugin import pd_guard

    monkeypatch.setattr(pd_guard, "_route_answers", {})  # no answer of another test's server
    answer = {"status": 200, "refuses_other_attn_tp": True, "attn_tp_size": 2}
    probes = []

    class Bootstrap(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            if self.path == "/health":
                self.send_response(200)
                self.end_headers()
            elif self.path == PLUGIN_ROUTE and answer["status"] == 200:
                probes.append(self.path)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(json.dumps({k: answer[k] for k in ("refuses_other_attn_tp", "attn_tp_size")}).encode())
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args):
            pass

    def manager(tp_size=1, attn_dp_size=1, arch=AttentionArch.MHA):
        args = types.SimpleNamespace(disaggregation_mode="decode", page_size=None, device="cuda", tp_size=tp_size,
                                     attn_cp_size=1, attn_dp_size=attn_dp_size)
        return types.SimpleNamespace(server_args=args, model_config=types.SimpleNamespace(attention_arch=arch))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Bootstrap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    refused = ("refuses this decode server: a VPP prefill .* at attention TP size 2 cannot serve a decode "
               "server at attention TP size 1 .* Start the decode server at attention TP size 2")
    try:
        # Within the answer's lifetime one probe serves every request: the probe blocks the
        # tokenizer's loop, so not one per request.
        for _ in range(3):
            with pytest.raises(InputRejectedError, match=refused):
                check_bootstrap_address(manager(), _request("127.0.0.1", port))
        assert len(probes) == 1
        # Past it, the prefill server behind the address is asked again (it may have been replaced).
        monkeypatch.setattr(pd_guard, "ROUTE_ANSWER_TTL_S", 0.0)
        with pytest.raises(InputRejectedError, match=refused):  # asked again: never remembered as served
            check_bootstrap_address(manager(), _request("127.0.0.1", port))
        with pytest.raises(InputRejectedError, match=refused):  # DP attention: --tp-size 2 at 2 DP ranks
            check_bootstrap_address(manager(tp_size=2, attn_dp_size=2), _request("127.0.0.1", port))
        check_bootstrap_address(manager(tp_size=2), _request("127.0.0.1", port))
        check_bootstrap_address(manager(arch=AttentionArch.MLA), _request("127.0.0.1", port))
        answer["attn_tp_size"] = None  # no prefill rank registered yet
        check_bootstrap_address(manager(), _request("127.0.0.1", port))
        answer.update(attn_tp_size=2, refuses_other_attn_tp=False)  # e.g. a stock-PP or a GPU prefill
        check_bootstrap_address(manager(), _request("127.0.0.1", port))
        answer.update(refuses_other_attn_tp=True, status=404)  # a prefill server without the plugin
        check_bootstrap_address(manager(), _request("127.0.0.1", port))
        answer["status"] = 200  # the same address, now a refusing prefill server again
        with pytest.raises(InputRejectedError, match=refused):
            check_bootstrap_address(manager(), _request("127.0.0.1", port))
    finally:
        server.shutdown()
        server.server_close()


@SKIP_NO_SGLANG
def test_bootstrap_server_route_says_what_the_prefill_refuses(monkeypatch):
    """The route the plugin adds to SGLang's bootstrap server answers with the prefill-side rule
    (a vpp* prefill on --device cpu over Mooncake) and the attention TP size the ranks registered."""
    import asyncio
    import json
    import types

    import sglang.srt.runtime_context as runtime_context
    from aiohttp import web

    from sglang_vpp.sglang_plugin.options import PipelineOptions, attach
    from sglang_vpp.sglang_plugin.pd_guard import PLUGIN_ROUTE, after_setup_routes

    def args(mode="vpp-pack", device="cpu", role="prefill", backend="mooncake"):
        server_args = types.SimpleNamespace(disaggregation_mode=role, device=device,
                                            disaggregation_transfer_backend=backend)
        attach(server_args, PipelineOptions(pp_mode=mode))
        return server_args

    server = types.SimpleNamespace(app=web.Application(), attn_tp_size=2)
    after_setup_routes(None, server)
    handler = next(r.handler for r in server.app.router.routes() if r.method == "GET"
                   and r.resource.canonical == PLUGIN_ROUTE)

    def ask(server_args):
        monkeypatch.setattr(runtime_context, "get_server_args", lambda: server_args)
        return json.loads(asyncio.run(handler(None)).body)

    assert ask(args()) == {"refuses_other_attn_tp": True, "attn_tp_size": 2}
    assert ask(args(backend="mooncake_tcp"))["refuses_other_attn_tp"] is True
    for other in (args(mode="cpp"), args(device="cuda"), args(role="decode"), args(backend="nixl"), None):
        assert ask(other)["refuses_other_attn_tp"] is False


@SKIP_NO_SGLANG
def test_bootstrap_guard_leaves_other_requests_alone():
    from sglang_vpp.sglang_plugin.pd_guard import check_bootstrap_address

    check_bootstrap_address(_decode_manager("prefill"), _request("127.0.0.1", 1))  # prefill: its own host
    check_bootstrap_address(_decode_manager("null"), _request("127.0.0.1", 1))
    check_bootstrap_address(_decode_manager(), _request(None, None))
    check_bootstrap_address(_decode_manager(), _request("2.2.2.2", 1))  # SGLang's warm-up room
    check_bootstrap_address(_decode_manager(), _request(["127.0.0.1"], [1]))  # a batch: per item


@SKIP_NO_SGLANG
@pytest.mark.slow
def test_abort_hook_applies_on_pp_prefill_only_and_ends_a_pending_chunked_abort():
    """In a fresh process (the hook patches SGLang's Scheduler): a pp-2 prefill registers the
    hook and it is applied; a pp-1 prefill or a decode server registers nothing; the hooked
    ``process_prefill_chunk`` runs ``process_pending_chunked_abort`` first."""
    code = textwrap.dedent("""
        import types
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.managers.scheduler import Scheduler
        from sglang_vpp.sglang_plugin import pd_abort
        from sglang_vpp.sglang_plugin.hook_targets import require_applied
        ns = types.SimpleNamespace
        assert not pd_abort.install_pd_abort_hook(ns(disaggregation_mode="prefill", pp_size=1))
        assert not pd_abort.install_pd_abort_hook(ns(disaggregation_mode="decode", pp_size=2))
        assert not pd_abort.install_pd_abort_hook(ns(disaggregation_mode="null", pp_size=2))
        assert pd_abort.install_pd_abort_hook(ns(disaggregation_mode="prefill", pp_size=2))
        HookRegistry.apply_hooks()
        require_applied(pd_abort.PREFILL_CHUNK_TARGET)
        calls = []
        fake = ns(chunked_req=None,
                  process_pending_chunked_abort=lambda: calls.append("abort"),
                  checkpoint_disagg_prefill=lambda req: None)
        Scheduler.process_prefill_chunk(fake, None, ns(batch_is_full=True))
        assert calls == ["abort"], calls
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


class _Receiver:
    def __init__(self, manager: "_Manager", room: int) -> None:
        self.manager, self.room, self.aborted = manager, room, False

    def abort(self) -> None:  # as SGLang's: records its own reason
        self.aborted = True
        self.manager.record_failure(self.room, "Aborted by AbortReq.")


class _Manager:
    """A decode KV manager whose parallel-info check raises for one prefill address, as
    SGLang's does on a page-size or KV-dtype mismatch."""

    def __init__(self, mismatched: str) -> None:
        self.mismatched = mismatched
        self.failure_records: dict[int, str] = {}
        self.asked: list[str] = []

    def try_ensure_parallel_info(self, addr: str) -> bool:
        self.asked.append(addr)
        if addr == self.mismatched:
            raise RuntimeError("KV cache dtype mismatch: prefill server has kv_cache_dtype=torch.float32, "
                               "but decode server has kv_cache_dtype=torch.bfloat16.")
        return True

    def record_failure(self, room: int, reason: str) -> None:
        self.failure_records[room] = reason


def _prealloc_queue(manager: _Manager):
    """SGLang's DecodePreallocQueue with only what ``_ensure_prefill_info`` reads."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    queue = object.__new__(DecodePreallocQueue)
    queue.kv_manager = manager
    queue._ensure_last_attempt_time, queue._ensure_retry_count = {}, {}
    queue._ensure_retry_interval, queue._max_ensure_retries = 1.0, 15
    return queue


def _decode_reqs(manager: _Manager, rooms: list[int]) -> list:
    from types import SimpleNamespace

    return [SimpleNamespace(req=SimpleNamespace(bootstrap_room=room), kv_receiver=_Receiver(manager, room))
            for room in rooms]


@SKIP_NO_SGLANG
def test_an_incompatible_prefill_server_fails_its_requests_not_the_decode_server():
    """SGLang's parallel-info check raises in the decode scheduler (ending the server); with the
    hook that address's requests fail with SGLang's reason, and another address is served."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    from sglang_vpp.sglang_plugin.pd_decode_refusal import ensure_prefill_info_per_address

    original = DecodePreallocQueue._ensure_prefill_info
    manager = _Manager(mismatched="10.0.0.2:8998")
    bad, good = _decode_reqs(manager, [7, 8]), _decode_reqs(manager, [9])
    with pytest.raises(RuntimeError, match="KV cache dtype mismatch"):  # what the hook stands between
        original(_prealloc_queue(manager), {"10.0.0.2:8998": bad, "10.0.0.1:8998": good})

    manager = _Manager(mismatched="10.0.0.2:8998")
    bad, good = _decode_reqs(manager, [7, 8]), _decode_reqs(manager, [9])
    bad.append(type(bad[0])(req=bad[0].req, kv_receiver=None))  # already cleaned up by SGLang
    # The mismatched address first: its error must not keep the other one from its answer.
    ready, remaining = ensure_prefill_info_per_address(
        original, _prealloc_queue(manager), {"10.0.0.2:8998": bad, "10.0.0.1:8998": good})
    assert ready == {"10.0.0.1:8998": good} and remaining == []
    assert manager.asked == ["10.0.0.2:8998", "10.0.0.1:8998"]
    assert all(r.kv_receiver.aborted for r in bad[:2]) and not good[0].kv_receiver.aborted
    for room in (7, 8):  # the client's error carries SGLang's reason, not "Aborted by AbortReq."
        assert "10.0.0.2:8998" in manager.failure_records[room]
        assert "KV cache dtype mismatch" in manager.failure_records[room]
    assert 9 not in manager.failure_records


@SKIP_NO_SGLANG
def test_the_decode_refusal_hook_is_for_decode_servers_only(monkeypatch):
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin import pd_decode_refusal

    registered = []
    monkeypatch.setattr("sglang_vpp.sglang_plugin.hook_targets.register_hook",
                        lambda path, hook, kind: registered.append(path))
    for mode in ("null", "prefill", None):
        assert not pd_decode_refusal.install_decode_refusal_hook(SimpleNamespace(disaggregation_mode=mode))
    assert registered == []
    assert pd_decode_refusal.install_decode_refusal_hook(SimpleNamespace(disaggregation_mode="decode"))
    assert registered == [pd_decode_refusal.ENSURE_PREFILL_INFO_TARGET]


@SKIP_NO_SGLANG
def test_a_release_this_rank_cannot_conclude_ends_the_server_naming_the_rank(monkeypatch):
    """Rank 0 releases a request once every rank's transfer status has ended; a rank whose own
    sender still says otherwise after the bounded wait (or that holds no such request) would keep
    its KV for good, since rank 0 never names it again: that is an error naming the rank, not a
    warning and a leak."""
    from types import SimpleNamespace

    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_vpp.sglang_plugin.vpp import pd_prefill
    from sglang_vpp.sglang_plugin.vpp.errors import SchedulerDivergenceError

    monkeypatch.setattr(pd_prefill, "RELEASE_WAIT_S", 0.01)

    def request(rid, status):
        return SimpleNamespace(rid=rid, disagg_kv_sender=SimpleNamespace(poll=lambda: status))

    def scheduler(queue):
        def process(rids):  # SGLang's: frees the checked requests whose own poll has ended
            done = [req for req in queue if req.rid in rids and req.disagg_kv_sender.poll() in (KVPoll.Success,
                                                                                                 KVPoll.Failed)]
            queue[:] = [req for req in queue if req not in done]
            return done
        return SimpleNamespace(disagg_prefill_inflight_queue=queue, process_disagg_prefill_inflight_queue=process)

    queue = [request("a", KVPoll.Success), request("b", KVPoll.Failed)]
    released = pd_prefill.PdPrefill(scheduler(queue), rank=1, tp=None)
    released.replay(("pd", "release", ["a", "b"]))
    assert released.num_released == 2 and queue == []

    stuck = pd_prefill.PdPrefill(scheduler([request("a", KVPoll.Success), request("b", KVPoll.Transferring)]),
                                 rank=2, tp=None)
    with pytest.raises(SchedulerDivergenceError, match=r"VPP PD rank 2: rank 0 released requests \['b'\]"):
        stuck.replay(("pd", "release", ["a", "b"]))
    absent = pd_prefill.PdPrefill(scheduler([]), rank=1, tp=None)
    with pytest.raises(SchedulerDivergenceError, match=r"requests \['c'\].*does not hold them"):
        absent.replay(("pd", "release", ["c"]))
