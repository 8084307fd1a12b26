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


def test_a_release_is_logged_and_asks_the_loop_for_a_scheduling_turn():
    """Rank 0 releases a request whose transfer ended on every rank; ``leader_poll`` then says so,
    and the loop runs a scheduling turn, where SGLang frees what its batch building still holds
    (an idle loop would keep it until the next request)."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    def request(rid: str, status: KVPoll):
        sender = SimpleNamespace(poll_pp_consensus=lambda: status, poll=lambda: status,
                                 kv_mgr=SimpleNamespace(request_status={}))
        return SimpleNamespace(rid=rid, bootstrap_room=1, disagg_kv_sender=sender)

    inflight = [request("done", KVPoll.Success), request("sending", KVPoll.Transferring)]
    freed = []
    scheduler = SimpleNamespace(
        disagg_prefill_bootstrap_queue=SimpleNamespace(queue=[]), disagg_prefill_inflight_queue=inflight,
        # SGLang's returns the requests it freed
        process_disagg_prefill_inflight_queue=lambda rids: freed.extend(rids) or [r for r in inflight if r.rid in rids],
    )
    pd = pd_prefill.PdPrefill(scheduler, rank=0, tp=SimpleNamespace(ready=lambda values, what: values))
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
