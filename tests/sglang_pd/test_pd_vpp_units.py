"""The PD pieces of a VPP prefill server without servers: layer ids and owned-layer registration
(``pd_layers.py``), the pairing check, and the loop's held-back KV sends and logged verdicts
(``vpp/pd_prefill.py``) on stand-in schedulers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang.srt.disaggregation.utils")

from sglang_vpp.sglang_plugin import pd_layers  # noqa: E402
from sglang_vpp.sglang_plugin.vpp import pd_prefill  # noqa: E402
from sglang_vpp.sglang_plugin.vpp.errors import SchedulerDivergenceError  # noqa: E402
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState, set_state  # noqa: E402


def _pool(kind: str, start: int, num: int):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    pool = object.__new__(MHATokenToKVPool if kind == "mha" else MLATokenToKVPool)
    pool.start_layer, pool.layer_num = start, num
    return pool


@pytest.fixture
def vpp_rank0():
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2), rank=0)
    state.ensure_layout(8)
    set_state(state)
    yield state
    set_state(None)


def test_plain_pools_publish_the_global_id_of_every_entry():
    assert pd_layers.registered_layer_ids(_pool("mha", 0, 3)) == [0, 1, 2, 0, 1, 2]  # K then V
    assert pd_layers.registered_layer_ids(_pool("mla", 4, 2)) == [4, 5]
    ids = pd_layers.around_build_kv_layer_ids(lambda **kw: [], token_to_kv_pool=_pool("mha", 2, 2),
                                              draft_token_to_kv_pool=None, num_draft_entries=0, num_hidden_layers=8)
    assert ids == [2, 3, 2, 3]
    kept = pd_layers.around_build_kv_layer_ids(lambda **kw: [9], token_to_kv_pool=_pool("mha", 0, 1),
                                               draft_token_to_kv_pool=None, num_draft_entries=0, num_hidden_layers=8)
    assert kept == [9]  # SGLang's own ids (hybrid pools) are left alone


def test_a_vpp_rank_registers_only_the_layers_it_owns(vpp_rank0):
    assert sorted(vpp_rank0.owned_layers()) == [0, 1, 6, 7] and vpp_rank0.hull() == (0, 8)
    pool = _pool("mha", 0, 8)
    entries = list(range(16))  # k0..k7, v0..v7 as stand-in pointers
    ptrs, lens, items = pd_layers.around_get_contiguous_buf_infos(lambda self: (entries, entries, entries), pool)
    assert ptrs == [0, 1, 6, 7, 8, 9, 14, 15] == lens == items
    assert pd_layers.registered_layer_ids(pool) == [0, 1, 6, 7, 0, 1, 6, 7]


def test_a_vpp_rank_registers_only_its_own_mla_latents(vpp_rank0):
    """SGLang's own MLA infos, on a pool whose hull holds zero-row placeholders (layers 2-5)."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    pool = _pool("mla", 0, 8)
    pool.page_size = 1
    pool.kv_buffer = [torch.zeros((4 if layer in (0, 1, 6, 7) else 0, 1, 3)) for layer in range(8)]
    ptrs, lens, items = pd_layers.around_get_contiguous_buf_infos(MLATokenToKVPool.get_contiguous_buf_infos, pool)
    assert ptrs == [pool.kv_buffer[layer].data_ptr() for layer in (0, 1, 6, 7)]
    assert lens == [4 * 3 * 4] * 4 and items == [3 * 4] * 4
    assert len(pool.kv_buffer) == 8 and pool.layer_num == 8  # the pool itself is left as it was
    assert pd_layers.registered_layer_ids(pool) == [0, 1, 6, 7]


def test_pairing_check_refuses_what_would_move_wrong_or_no_layers():
    src = [0, 1, 6, 7, 0, 1, 6, 7]
    decode_pp1 = list(range(8)) * 2
    assert pd_layers.pairing_problem(src, decode_pp1, 8, 16, prefill_pp_size=2) is None
    no_ids = pd_layers.pairing_problem(src, [], 8, 16, prefill_pp_size=2)
    assert no_ids and "both PD peers or neither" in no_ids and "install the plugin" in no_ids
    decode_pp2_rank0 = [0, 1, 2, 3] * 2
    missing = pd_layers.pairing_problem(src, decode_pp2_rank0, 8, 8, prefill_pp_size=2)
    assert missing and "layer 6" in missing and "--pp-size 1" in missing
    assert pd_layers.pairing_problem([], decode_pp1, 16, 16, prefill_pp_size=1) is None  # SGLang's fallback


def test_scheduling_time_sends_are_held_and_made_when_the_chunk_result_is_applied():
    calls = []
    send = lambda self, req, last_chunk=False, end_idx=None: calls.append((req, last_chunk, end_idx))  # noqa: E731
    pd_prefill.around_send_kv_chunk(send, None, "r", last_chunk=False)  # scheduling / early prefix
    pd_prefill.around_send_kv_chunk(send, None, "r", last_chunk=True)
    token = pd_prefill._RESULT_SENDS.set(True)
    try:
        pd_prefill.around_send_kv_chunk(send, None, "r", last_chunk=False)
    finally:
        pd_prefill._RESULT_SENDS.reset(token)
    assert calls == [("r", True, None), ("r", False, None)]

    middle = SimpleNamespace(inflight_middle_chunks=1, disagg_kv_sender=object(), pending_bootstrap=False,
                             metadata_buffer_index=0)
    last = SimpleNamespace(inflight_middle_chunks=0)
    order = []
    scheduler = SimpleNamespace(
        _pp_process_batch_result=lambda batch, result: order.append("result"),
        send_kv_chunk=lambda req, last_chunk, end_idx: order.append((req is middle, last_chunk, end_idx)),
    )
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: True), reqs=[middle, last],
                            prefix_lens=[64, 0], extend_lens=[64, 40])
    pd_prefill.PdPrefill(scheduler, rank=1, tp=None).process_result(batch, None)
    assert order == ["result", (True, False, 128)]


def test_every_rank_applies_the_logged_bootstrap_verdict_and_a_diverged_queue_is_named():
    seen = []
    scheduler = SimpleNamespace(process_bootstrapped_queue=lambda: seen.append(
        pd_prefill.around_poll_prefill_pp(lambda *a: pytest.fail("polled the PP ring"), ["s1", "s2"])))
    pd = pd_prefill.PdPrefill(scheduler, rank=1, tp=None)
    pd.replay(("pd", "boot", [2, 1]))
    assert seen == [[2, 1]]
    with pytest.raises(SchedulerDivergenceError, match="covers 1 requests but .* holds 2"):
        pd.replay(("pd", "boot", [2]))
    assert pd_prefill.around_poll_prefill_pp(lambda pollers, *a: "stock", ["s1"]) == "stock"


def _leader_with_inflight(inflight: list):
    """Rank 0's PD steps on a stand-in scheduler with these requests in transfer; ``freed`` lists
    the ids SGLang's release step was given (it returns the requests it freed)."""
    freed: list = []
    scheduler = SimpleNamespace(
        disagg_prefill_bootstrap_queue=SimpleNamespace(queue=[]), disagg_prefill_inflight_queue=inflight,
        process_disagg_prefill_inflight_queue=lambda rids: freed.extend(rids) or [r for r in inflight if r.rid in rids],
    )
    pd = pd_prefill.PdPrefill(scheduler, rank=0, tp=SimpleNamespace(ready=lambda values, what: values))
    return pd, scheduler, freed


def test_a_release_is_logged_and_asks_the_loop_for_a_scheduling_turn():
    """Rank 0 releases a request whose transfer ended on every rank; ``leader_poll`` then says so,
    and the loop runs a scheduling turn, where SGLang frees what its batch building still holds
    (an idle loop would keep it until the next request)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    def request(rid: str, status: KVPoll):
        sender = SimpleNamespace(poll_pp_consensus=lambda: status, poll=lambda: status,
                                 kv_mgr=SimpleNamespace(request_status={}))
        return SimpleNamespace(rid=rid, bootstrap_room=1, bootstrap_host="127.0.0.1", disagg_kv_sender=sender)

    inflight = [request("done", KVPoll.Success), request("sending", KVPoll.Transferring)]
    pd, scheduler, freed = _leader_with_inflight(inflight)
    events = []
    assert pd.leader_poll(events) is True
    assert events == [("pd", "release", ["done"])] and freed == ["done"]
    scheduler.disagg_prefill_inflight_queue = [inflight[1]]
    assert pd.leader_poll(events) is False and len(events) == 1  # nothing ended: the loop may idle


def test_a_head_sliced_transfer_fails_at_once_naming_the_flags_and_the_fix(caplog, monkeypatch):
    """A decode server at another attention TP size: the transfer fails (-1, so SGLang fails the
    request) without reaching Mooncake, and the log names both sizes and the fix, once per decode
    session however many chunks and ranks reach it."""
    monkeypatch.setattr(pd_prefill, "_REFUSALS_LOGGED", set())
    reached = []
    manager = SimpleNamespace(attn_tp_size=2)

    def send(session):
        return pd_prefill.around_send_kvcache_slice(lambda *a, **k: reached.append(a) or 0, manager, session,
                                                    [0], [1], [2], 0, 1, 64, None)

    with caplog.at_level("ERROR"):
        assert [send("peer:1"), send("peer:1"), send("peer:2")] == [-1, -1, -1]
    assert not reached
    assert "at attention TP size 2 cannot serve a decode server at attention TP size 1" in caplog.text
    assert "Start the decode server at attention TP size 2 (--tp-size 2 without DP attention" in caplog.text
    assert [r.getMessage().count("peer:") for r in caplog.records] == [1, 1]
    assert "decode session peer:1" in caplog.records[0].getMessage()
    assert "decode session peer:2" in caplog.records[1].getMessage()


def _boot_replica(buffers: int):
    """A rank's scheduler as far as bootstrap admission reaches: SGLang's own bootstrap queue and
    metadata-buffer allocator, every buffer but ``buffers`` held by requests still in transfer."""
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator
    from sglang.srt.managers.scheduler_pp_mixin import SchedulerPPMixin

    allocator = ReqToMetadataIdxAllocator(2)
    for _ in range(2 - buffers):
        allocator.alloc()
    scheduler = SimpleNamespace(waiting_queue=[], disagg_prefill_inflight_queue=[], processed_tokens_counter=0,
                                attn_cp_cpu_group=None, attn_tp_cpu_group=None, pp_group=None,
                                token_to_kv_pool_allocator=SimpleNamespace(page_size=1))
    queue = object.__new__(PrefillBootstrapQueue)
    queue.__dict__.update(queue=[], pp_size=2, pp_rank=0, pp_poll_sync_work_list=[], scheduler=scheduler,
                          scheduler_stage_metrics=None, req_to_metadata_buffer_idx_allocator=allocator)
    scheduler.disagg_prefill_bootstrap_queue = queue
    scheduler.process_bootstrapped_queue = lambda: SchedulerPPMixin.process_bootstrapped_queue(scheduler)
    return scheduler


def _bootstrapped_request(rid: str):
    """A request whose decode side has connected on every PP rank (consensus WaitingForInput)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    sender = SimpleNamespace(poll_pp_consensus=lambda: KVPoll.WaitingForInput, pop_decode_prefix_len=lambda: 0,
                             init=lambda num_pages, index: None)
    stats = SimpleNamespace(set_bootstrap_done_time=lambda: None, set_wait_queue_entry_time=lambda: None)
    return SimpleNamespace(rid=rid, disagg_kv_sender=sender, pending_bootstrap=True, metadata_buffer_index=-1,
                           is_retracted=False, prefill_attempt_count=0, origin_input_ids=[1] * 8, time_stats=stats)


def test_a_request_waiting_for_a_metadata_buffer_is_logged_once_it_is_admitted(monkeypatch):
    """Every metadata buffer is held by requests still in transfer, so SGLang leaves a bootstrapped
    request in its bootstrap queue, poll after poll. Rank 0 logs nothing for those polls (no rank's
    state changed), and the one verdict that admits it once a buffer is free, which every rank's
    replay applies alike."""
    import sglang.srt.disaggregation.prefill as prefill

    monkeypatch.setattr(prefill, "poll_and_all_reduce_prefill_pp", lambda pollers, *a: pd_prefill.around_poll_prefill_pp(
        lambda *b: pytest.fail("polled the PP ring"), pollers, *a))
    leader, follower = _boot_replica(buffers=0), _boot_replica(buffers=0)
    for scheduler in (leader, follower):
        scheduler.disagg_prefill_bootstrap_queue.queue.append(_bootstrapped_request("r"))
    pd = pd_prefill.PdPrefill(leader, rank=0, tp=SimpleNamespace(ready=lambda values, what: values))
    events: list = []
    for _ in range(5):
        assert pd.leader_poll(events) is False
    assert events == [] and len(leader.disagg_prefill_bootstrap_queue.queue) == 1 and not leader.waiting_queue

    for scheduler in (leader, follower):  # a transfer ended: its release frees a buffer on every rank
        scheduler.disagg_prefill_bootstrap_queue.req_to_metadata_buffer_idx_allocator.free(0)
    assert pd.leader_poll(events) is True
    assert events == [("pd", "boot", [2])]
    pd_prefill.PdPrefill(follower, rank=1, tp=None).replay(events[0])
    for scheduler in (leader, follower):
        assert [req.rid for req in scheduler.waiting_queue] == ["r"] and not scheduler.disagg_prefill_bootstrap_queue.queue
        assert scheduler.waiting_queue[0].metadata_buffer_index == 0 and not scheduler.waiting_queue[0].pending_bootstrap


def _sender_of_two_ranks(room: int, own, later):
    """SGLang's KV sender on PP rank 0 as far as its polls reach: its own status and PP rank 1's,
    replicated into rank 0's consensus store."""
    import threading

    from sglang.srt.disaggregation.common.conn import CommonKVManager, CommonKVSender
    from sglang.srt.disaggregation.pp_consensus_store import PPConsensusStore

    store = object.__new__(PPConsensusStore)
    store.__dict__.update(_pp_size=2, _pp_rank=0, _local_map={room: own}, _peer_map={1: {room: later}},
                          _cache_lock=threading.Lock())
    manager = SimpleNamespace(request_status=store, _staging_outstanding={}, defer_decode_allocation=False,
                              reports_transfer_latency=False)
    manager.check_status = lambda r: CommonKVManager.check_status(manager, r)
    manager.check_status_pp_consensus = lambda r: CommonKVManager.check_status_pp_consensus(manager, r)
    sender = object.__new__(CommonKVSender)
    sender.__dict__.update(conclude_state=None, bootstrap_room=room, kv_mgr=manager, _transfer_start_time=None,
                           trace_ctx=SimpleNamespace(trace_req_finish=lambda: None))
    return sender, store


def test_a_request_still_sending_on_a_later_rank_is_not_released_after_a_local_poll():
    """SGLang's release step polls every in-flight sender on rank 0 alone, and a sender keeps the
    first ended state a poll saw: rank 0's own Success then answers every later consensus poll.
    Rank 0 still waits for rank 1's own transfer (else rank 1 would be told to free a request it
    is sending), and releases it once rank 1's status has ended."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    sender, store = _sender_of_two_ranks(7, KVPoll.Success, KVPoll.WaitingForInput)
    assert sender.poll() == KVPoll.Success  # what releasing another request does to this one
    assert sender.poll_pp_consensus() == KVPoll.Success  # remembered: rank 1 is not asked
    pd, _, freed = _leader_with_inflight([SimpleNamespace(rid="r", bootstrap_room=7, bootstrap_host="127.0.0.1",
                                                           disagg_kv_sender=sender)])
    events = []
    assert pd.leader_poll(events) is False and events == [] and freed == []
    store._peer_map[1][7] = KVPoll.Success  # rank 1's transfer ended
    assert pd.leader_poll(events) is True and events == [("pd", "release", ["r"])] and freed == ["r"]


def test_a_health_check_is_released_when_its_fake_transfer_ends_whatever_shares_its_room():
    """A health check or warm-up sends to no decode server: SGLang gives it the fake host, room 0
    and a fake sender over the real consensus store. A client's request may hold room 0 in that
    store, still sending on rank 1; the health check is released on its own sender's verdict."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    _, store = _sender_of_two_ranks(0, KVPoll.WaitingForInput, KVPoll.WaitingForInput)
    fake = SimpleNamespace(poll_pp_consensus=lambda: KVPoll.Success, poll=lambda: KVPoll.Success,
                           kv_mgr=SimpleNamespace(request_status=store))
    check = SimpleNamespace(rid="health", bootstrap_room=0, bootstrap_host=FAKE_BOOTSTRAP_HOST, disagg_kv_sender=fake)
    pd, _, freed = _leader_with_inflight([check])
    events = []
    assert pd.leader_poll(events) is True and events == [("pd", "release", ["health"])] and freed == ["health"]
