"""Fast checks of the VPP pieces that need no server: config errors and the records' replay."""

from __future__ import annotations

import re

import pytest
from sglang_vpp.sglang_plugin.vpp.errors import CommTimeoutError, VppConfigError
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState
from sglang_vpp.serving.record_replay import replay_window


def test_config_refuses_pp1_and_bad_split_with_the_fix():
    with pytest.raises(VppConfigError, match="--pp-size >= 2"):
        VppConfig(mode="vpp", pp_size=1)
    with pytest.raises(VppConfigError, match="2,2,2 has 3 entries but --pp-size 2 has 4 virtual stages"):
        VppConfig(mode="vpp-pack", pp_size=2, layer_split=(2, 2, 2))
    with pytest.raises(VppConfigError, match="not a VPP mode"):
        VppConfig(mode="cpp", pp_size=2)


def test_layout_ownership_is_foldback():
    state = VppState(config=VppConfig(mode="vpp-async", pp_size=2), rank=0)
    state.ensure_layout(8)
    assert state.owned_stages() == (0, 3)
    assert state.owned_layers() == frozenset({0, 1, 6, 7})
    assert state.hull() == (0, 8)
    state.rank = 1
    assert state.owned_layers() == frozenset({2, 3, 4, 5}) and state.hull() == (2, 6)
    with pytest.raises(VppConfigError, match="second layer stack"):
        state.ensure_layout(6)
    with pytest.raises(VppConfigError, match="cannot fill"):
        VppState(config=VppConfig(mode="vpp", pp_size=2)).ensure_layout(3)


def test_fused_fold_gives_the_last_rank_one_stage_and_check_trace_rebuilds_it():
    from sglang_vpp.schedule import Fold
    from sglang_vpp.serving.decision_replay import _build_controller, recorded_layout

    from sglang_vpp.sglang_plugin.options import layer_split_count_error

    # The scheduler's config refuses with the launcher's words (one rule, one message).
    words = layer_split_count_error((2, 2, 2, 2), 2, Fold.FUSED)
    assert words is not None and "3 virtual stages (2 per rank, 1 on the last with --vpp-fold fused)" in words
    with pytest.raises(VppConfigError, match=re.escape(words)):
        VppConfig(mode="vpp-pack", pp_size=2, layer_split=(2, 2, 2, 2), fold=Fold.FUSED)
    assert layer_split_count_error((2, 4, 2), 2, Fold.FUSED) is None and layer_split_count_error(None, 2, Fold.FUSED) is None
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, fold=Fold.FUSED), rank=1)
    state.ensure_layout(8)
    # The method's even split with the fold's two stages as one: every rank keeps its layers.
    assert state.owned_stages() == (1,) and state.owned_layers() == frozenset({2, 3, 4, 5})
    state.rank = 0
    assert state.owned_stages() == (0, 2) and state.owned_layers() == frozenset({0, 1, 6, 7})
    controller = state.build_controller(64)
    inputs = state.controller_inputs(controller)
    assert inputs["fold"] == "fused" and inputs["stage_layers"] == [2, 4, 2]
    assert recorded_layout(inputs) == state.layout
    assert _build_controller(inputs, rank=0).layout == state.layout
    split = VppState(config=VppConfig(mode="vpp-pack", pp_size=2), rank=0)
    split.ensure_layout(8)
    # A split fold records no fold, as traces written before the option did, and replays as split.
    split_inputs = split.controller_inputs(split.build_controller(64))
    assert "fold" not in split_inputs and recorded_layout(split_inputs).fold is Fold.SPLIT


def test_install_builds_a_fused_config_that_takes_its_split(monkeypatch):
    """``install`` (each scheduler) must check a fused server's 2P-1 layer counts against the fused
    layout, as the launcher's checks did: a split fold would refuse them."""
    from types import SimpleNamespace

    import sglang_vpp.sglang_plugin.hook_targets as hook_targets
    import sglang_vpp.sglang_plugin.vpp as vpp
    from sglang_vpp.schedule import Fold
    from sglang_vpp.sglang_plugin.options import PipelineOptions, attach

    monkeypatch.setattr(hook_targets, "register_hook", lambda *args, **kwargs: None)  # patch nothing in SGLang
    monkeypatch.setattr(vpp, "_refuse_unsupported", lambda *args, **kwargs: None)  # checked in test_plugin_cli
    monkeypatch.setattr(vpp, "_refuse_missing_hook_targets", lambda *args: None)  # test_surface
    installed = []
    monkeypatch.setattr(vpp, "get_state", lambda: None)
    monkeypatch.setattr(vpp, "set_state", installed.append)
    args = SimpleNamespace(pp_size=2, chunked_prefill_size=64, device="cpu", disaggregation_mode="null")
    attach(args, PipelineOptions(pp_mode="vpp-pack", vpp_layer_split=(2, 4, 2), vpp_fold=Fold.FUSED))
    vpp.install(args)
    assert installed and installed[0].config.fold is Fold.FUSED and installed[0].config.layer_split == (2, 4, 2)


def test_comm_timeout_names_peer_group_and_fix():
    from sglang_vpp.comm import CommTimeoutError as CommLayerTimeout
    from sglang_vpp.sglang_plugin.vpp.event_loop import inbox_timeout

    assert CommTimeoutError is CommLayerTimeout  # one timeout error for every pipeline wait
    err = inbox_timeout(0, 1, "hidden states of micro-batch 3", 5.0)
    text = str(err)
    assert "peer rank 1" in text and "'fwd/bwd'" in text and "micro-batch 3" in text
    assert "--vpp-comm-timeout" in text and "SGLANG_VPP_COMM_TIMEOUT_S" in text


def _linear_records(num_chunks: int, order_rank0: list[tuple[int, int]]) -> list[dict]:
    """tau_k = (k + 1) per stage; rank 0 executes ``order_rank0`` (stage, seq), rank 1 FIFO."""
    records = []
    for t, (stage, seq) in enumerate(order_rank0):
        records.append({"rank": 0, "stage": stage, "seq": seq, "start_s": float(t), "cpu_s": seq + 1.0,
                        "num_tokens": 64})
    for seq in range(num_chunks):
        for stage in (1, 2):
            records.append({"rank": 1, "stage": stage, "seq": seq, "start_s": seq + stage / 10, "cpu_s": seq + 1.0,
                            "num_tokens": 64})
    return records


def _as_contiguous(records: list[dict]) -> list[dict]:
    """The same layers placed as stock CPP: rank r runs virtual stages 2r and 2r+1 as one stage,
    micro-batches in order."""
    cost: dict[tuple[int, int], float] = {}
    for record in records:
        key = (record["stage"] // 2, record["seq"])
        cost[key] = cost.get(key, 0.0) + record["cpu_s"]
    return [{"rank": rank, "stage": rank, "seq": seq, "start_s": float(seq), "cpu_s": c, "num_tokens": 64}
            for (rank, seq), c in cost.items()]


def test_replay_reproduces_the_balance_argument():
    # Algorithm 1 order on rank 0: s0 C0, s0 C1, then pairs (s3 C_{k-1}, s0 C_{k+1}), drain.
    n = 6
    order = [(0, 0), (0, 1)]
    for k in range(1, n - 1):
        order += [(3, k - 1), (0, k + 1)]
    order += [(3, n - 2), (3, n - 1)]
    records = _linear_records(n, order)
    vpp = replay_window(records, 2).ranks
    cpp = replay_window(_as_contiguous(records), 2).ranks
    work = sum(r["cpu_s"] for r in records)
    assert sum(t.busy_s for t in vpp) == pytest.approx(work) == pytest.approx(sum(t.busy_s for t in cpp))
    # With linear tau_k, CPP's rank 1 waits for rank 0 on every chunk while VPP's ranks pair
    # chunk k+1 with chunk k-1: less total idle for the same work.
    assert sum(t.idle_s for t in vpp) < sum(t.idle_s for t in cpp)
    assert vpp[0].makespan_s < cpp[0].makespan_s


def test_cost_profile_drives_the_controller_and_travels_with_the_trace(tmp_path):
    from sglang_vpp.schedule import LinearAttentionCost
    from sglang_vpp.serving.decision_replay import _build_controller
    from sglang_vpp.sim.cost.fitted import Coefficients, FittedCostModel

    analytic = VppState(config=VppConfig(mode="vpp-pack", pp_size=2), rank=0)
    analytic.ensure_layout(8)
    assert isinstance(analytic.build_controller(64).cost, LinearAttentionCost)
    assert "no --vpp-cost-profile" in analytic.cost_source()
    path = tmp_path / "costs.json"
    FittedCostModel({}, Coefficients(2e-9, 3e-7, 1e-4)).save(path)
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, cost_profile=str(path)), rank=0)
    state.ensure_layout(8)
    controller = state.build_controller(64)
    assert isinstance(controller.cost, FittedCostModel) and str(path) in state.cost_source()
    rebuilt = _build_controller(state.controller_inputs(controller), rank=0)  # what check --trace does
    stage = state.layout.stages[1]
    from sglang_vpp.schedule import ChunkSpec

    chunk = ChunkSpec(0, 3, 192, 64)
    assert rebuilt.cost.stage_cost(stage, chunk) == controller.cost.stage_cost(stage, chunk) > 0
    (tmp_path / "bad.json").write_text("{}")
    broken = VppState(config=VppConfig(mode="vpp", pp_size=2, cost_profile=str(tmp_path / "bad.json")), rank=0)
    broken.ensure_layout(8)
    with pytest.raises(VppConfigError, match="--vpp-cost-profile .* is not a readable fitted cost model"):
        broken.cost_model()


def test_a_cost_profile_fitted_for_another_layout_is_refused_when_the_controller_is_built(tmp_path):
    """Fitted per stage at pp 2 contiguous (2 stages of 4 layers): vpp at pp 2 runs 4 stages of 2,
    none of which has a fit; unchecked, the first estimate of such a stage would fail mid-run."""
    from sglang_vpp.sim.cost.fitted import Coefficients, FittedCostModel

    path = tmp_path / "costs.json"
    FittedCostModel({0: Coefficients(2e-9, 3e-7, 1e-4, 5, 0.0, 4), 1: Coefficients(2e-9, 3e-7, 1e-4, 5, 0.0, 4)}).save(path)
    state = VppState(config=VppConfig(mode="vpp", pp_size=2, cost_profile=str(path)), rank=0)
    state.ensure_layout(8)
    with pytest.raises(VppConfigError, match=r"^--vpp-cost-profile '.*costs.json' was fitted for stages 0 \(4 layers\), "
                                             r"1 \(4 layers\) with no per-layer fit; used with a model of 8 layers in 4 "
                                             r"foldback stages \(2 ranks\) of 2, 2, 2, 2 layers, .* or leave the flag out$"):
        state.build_controller(64)


@pytest.mark.parametrize("on_cpu", [False, True])
@pytest.mark.parametrize("auto_chunk", [False, True])
def test_the_server_controller_decides_with_the_factory_estimate(on_cpu, auto_chunk):
    from sglang_vpp.schedule.factory import choose_cost

    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, on_cpu=on_cpu, auto_chunk=auto_chunk), rank=0)
    state.ensure_layout(8)
    choice = choose_cost(state.layout, on_cpu=on_cpu, auto_chunk=auto_chunk)
    assert state.build_controller(64).cost == choice.model and state.cost_source() == choice.source


def _on(refusal):
    """A value that turns the refused feature on."""
    probe = {"speculative_algorithm": "EAGLE", "disaggregation_mode": "decode",
             "disaggregation_transfer_backend": "ascend", "kv_cache_dtype": "fp4_mx_block16", "device": "npu",
             "prefill_delayer_queue_min_ratio": 0.5}
    return probe.get(refusal.attr, 2 if refusal.attr.endswith("size") else True)


def test_one_refusal_list_for_the_launcher_and_the_scheduler_process():
    import argparse

    from sglang_vpp.sglang_plugin.errors import PpModeError
    from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS, check_vpp_features
    from sglang_vpp.sglang_plugin.vpp import _refuse_unsupported

    base = {refusal.attr: None for refusal in VPP_REFUSALS}
    base.update(pp_size=2, tp_size=2, chunked_prefill_size=64)
    check_vpp_features(argparse.Namespace(**base), "vpp")  # TP inside the stages is served
    _refuse_unsupported(argparse.Namespace(**base), "vpp-pack")
    assert len({r.flag for r in VPP_REFUSALS}) == len(VPP_REFUSALS)
    for refusal in VPP_REFUSALS:
        args = argparse.Namespace(**{**base, refusal.attr: _on(refusal)})
        for check in (check_vpp_features, _refuse_unsupported):
            with pytest.raises(PpModeError, match=f"does not support {re.escape(refusal.flag)} .*"
                                                  f"{re.escape(refusal.reason)}. {re.escape(refusal.advice())}$"):
                check(args, "vpp-async")


def _server_chunk_sizer(monkeypatch, mode: str, chunk: int, max_prefill_tokens: int):
    """A pp 2, 8-layer VPP state of ``mode`` whose controller answers SGLang's dynamic-chunking slot
    on a scheduler with ``--chunked-prefill-size chunk``; returns (state, scheduler)."""
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp import chunk_sizing, state as vpp_state

    state = VppState(config=VppConfig(mode=mode, pp_size=2), rank=0)
    state.ensure_layout(8)
    monkeypatch.setattr(vpp_state, "_STATE", state)
    monkeypatch.setattr(chunk_sizing, "_sizer", None)
    scheduler = SimpleNamespace(chunked_prefill_size=chunk, max_prefill_tokens=max_prefill_tokens, chunked_req=None,
                                dynamic_chunk_sizer=None)
    chunk_sizing.install_chunk_sizer(scheduler, state.build_controller(chunk))
    return state, scheduler


def _continued_cuts(scheduler, req, cut: list[int]) -> list[int]:
    """``cut`` (the chunks taken so far) extended by the sizes SGLang's slot gives ``req`` until it is whole."""
    length = len(req.origin_input_ids)
    scheduler.chunked_req = req
    while sum(cut) < length:
        req.prefix_len = sum(cut)
        cut.append(min(scheduler.dynamic_chunk_sizer.predict(req.prefix_len), length - req.prefix_len))
    return cut


def test_vpp_taper_server_cuts_the_chunks_the_planner_cuts(monkeypatch):
    """The server's chunk sizes (first chunk through the adder hook, later ones through SGLang's
    dynamic-chunking slot, both answered by the controller) are ``split_request`` of the schedule
    core's chunker."""
    from types import SimpleNamespace

    from sglang_vpp.schedule import default_chunker, split_request
    from sglang_vpp.sglang_plugin.vpp import chunk_sizing

    state, scheduler = _server_chunk_sizer(monkeypatch, "vpp-taper", 128, 16384)
    sizer = scheduler.dynamic_chunk_sizer
    assert sizer is chunk_sizing._sizer
    length = 600
    req = SimpleNamespace(prefix_len=0, origin_input_ids=[1] * length, output_ids=[])

    def admit(adder, request, *args, **kwargs):  # SGLang cuts a chunk at the budget it sees
        remaining = len(request.origin_input_ids) - request.prefix_len
        take = min(adder.rem_chunk_tokens, remaining)
        adder.rem_chunk_tokens -= take
        adder.new_chunked_req = request if take < remaining else None
        adder.taken = take

    adder = SimpleNamespace(rem_chunk_tokens=128, new_chunked_req=None, can_run_list=[])
    chunk_sizing.around_add_one_req(admit, adder, req, has_chunked_req=False, truncation_align_size=None)
    cut = _continued_cuts(scheduler, req, [adder.taken])
    planned = [size for _, size in split_request(default_chunker(state.config.policy, 128, state.layout, None, 128), length)]
    assert cut == planned and planned[0] < 128 < length and max(planned) == 128, planned
    # A short request is left whole, and a refused one gives its budget back.
    short = SimpleNamespace(prefix_len=0, origin_input_ids=[1] * 100, output_ids=[])
    adder = SimpleNamespace(rem_chunk_tokens=128, new_chunked_req=None, can_run_list=[])
    chunk_sizing.around_add_one_req(admit, adder, short)
    assert adder.taken == 100 and adder.rem_chunk_tokens == 28
    adder = SimpleNamespace(rem_chunk_tokens=128, new_chunked_req=None, can_run_list=[])
    chunk_sizing.around_add_one_req(lambda *a, **k: None, adder, req)
    assert adder.rem_chunk_tokens == 128


def test_a_max_prefill_tokens_below_the_chunk_size_leaves_a_requests_last_chunk_whole(monkeypatch):
    """``--max-prefill-tokens`` below ``--chunked-prefill-size``: SGLang cuts every chunk at the
    chunk size (the input cap only stops further requests joining), so the budget of the batch
    that ends a chunked request is the chunk size, and the server cuts the planner's chunks."""
    from types import SimpleNamespace

    from sglang_vpp.schedule import default_chunker, split_request

    state, scheduler = _server_chunk_sizer(monkeypatch, "vpp-pack", 64, 32)
    length = 114  # a first chunk of 64, then 50 left: more than the input cap, less than a chunk
    req = SimpleNamespace(prefix_len=64, origin_input_ids=[1] * length, output_ids=[])
    cut = _continued_cuts(scheduler, req, [64])
    planned = [size for _, size in split_request(default_chunker(state.config.policy, 64, state.layout, None, 64), length)]
    assert cut == planned == [64, 50]


def test_decode_retraction_keeps_a_slots_last_request_while_others_hold_kv():
    """A slot whose last decode request cannot get its next token retracts it (back to the queue)
    while another request holds KV; with no other request it stays aborted, as in SGLang."""
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp.retraction import around_retract_decode

    def make(rows_in_use: int, beam_group=None):
        last = SimpleNamespace(rid="last", to_finish="oom-abort", beam_group=beam_group, output_ids=[7] * 40,
                               sampling_params=SimpleNamespace(max_new_tokens=100))
        earlier = SimpleNamespace(rid="earlier", to_finish=None, beam_group=None)
        pool = SimpleNamespace(size=8, available_size=lambda: 8 - rows_in_use)
        batch = SimpleNamespace(reqs=[], req_to_token_pool=pool)
        # SGLang's contract: (retracted, new token ratio, aborted); the OOM abort of the batch's
        # last request comes last and leaves the batch empty.
        # SGLang's ratio is over the requests left in the slot: none, so 0.
        return batch, last, lambda b: ([earlier], 0.0, [last])

    batch, last, original = make(rows_in_use=2)
    retracted, ratio, aborted = around_retract_decode(original, batch)
    assert [r.rid for r in retracted] == ["earlier", "last"] and aborted == []
    assert last.to_finish is None
    # The admission ratio SGLang would set after retracting this request, not the empty slot's 0.
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker

    assert ratio == NewTokenRatioTracker.estimate_new_token_ratio_after_retract([last]) > 0.3
    batch, last, original = make(rows_in_use=0)  # nothing else holds KV: the request cannot fit
    retracted, _, aborted = around_retract_decode(original, batch)
    assert aborted == [last] and last.to_finish == "oom-abort" and [r.rid for r in retracted] == ["earlier"]
    batch, last, original = make(rows_in_use=2, beam_group=object())  # beam groups are never retracted
    assert around_retract_decode(original, batch)[2] == [last]
    batch, last, original = make(rows_in_use=2)
    batch.reqs = ["kept"]  # the batch still decodes: nothing was aborted for memory
    assert around_retract_decode(original, batch)[2] == [last]


class _FakeReq:
    def __init__(self, rid: str, finished: bool = False) -> None:
        self.rid, self._finished = rid, finished
        self.is_prefill_only = False
        self.to_finish = None

    def finished(self) -> bool:
        return self._finished


class _FakeBatch:
    """The ScheduleBatch calls the decode regrouper makes, on a list of requests."""

    def __init__(self, reqs=(), extend: bool = False, chunked_req=None, batch_is_full: bool = False) -> None:
        from types import SimpleNamespace

        self.reqs = list(reqs)
        self.forward_mode = SimpleNamespace(is_extend=lambda: extend)
        self.chunked_req = chunked_req
        self.batch_is_full = batch_is_full
        self.is_prefill_only = False

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    def filter_batch(self, reqs_to_exclude=()) -> None:
        self.reqs = [r for r in self.reqs if not r.finished() and r not in reqs_to_exclude]

    def merge_batch(self, other) -> None:
        self.reqs += other.reqs
        self.is_prefill_only = self.is_prefill_only and other.is_prefill_only


def test_decode_regrouper_moves_ended_prefills_to_the_least_loaded_open_decode_slot():
    """vpp-pack, P = 2: 6 slots, decode in slots 0 and 3. A prefill that ends in slot 1 joins
    the open decode slot with fewer running requests, without its finished and chunked
    requests; with every decode slot in flight it is held (in slot 2's running batch, flagged
    so SGLang does not decode it) and joins the first decode slot whose result comes."""
    from types import SimpleNamespace

    from sglang_vpp.schedule import LinearAttentionCost, build_controller, build_layout, controller_config
    from sglang_vpp.sglang_plugin.vpp.decode_slots import DecodeRegrouper

    layout = build_layout(2, 8, "foldback")
    controller = build_controller(controller_config("vpp-pack", layout, 64, LinearAttentionCost(), 64))
    done, chunked = _FakeReq("done", True), _FakeReq("chunked")
    a, b, c = (_FakeReq(n) for n in "abc")
    s = SimpleNamespace(chunked_req=chunked, running_batch=None,
                        running_mbs=[_FakeBatch([a, b]), *(_FakeBatch() for _ in range(5))],
                        last_mbs=[None] * 6)
    records = []
    regroup = DecodeRegrouper(s, controller, lambda **fields: records.append(fields))
    s.running_mbs[3] = _FakeBatch([_FakeReq("x")])
    regroup.on_scheduled(0, s.running_mbs[0])          # slot 0's decode batch is in flight
    prefill = _FakeBatch([c, done, chunked], extend=True, chunked_req=chunked)
    s.last_mbs[1] = prefill
    regroup.on_scheduled(1, prefill)
    regroup.on_result(1)
    assert [r.rid for r in s.running_mbs[3].reqs] == ["x", "c"] and s.last_mbs[1] is None
    assert records == [{"from_slot": 1, "running": [[3, 1]], "chosen": 3}]
    # Both decode slots in flight: the request is held in slot 2, not decoded there.
    regroup.on_scheduled(3, s.running_mbs[3])
    d, e = _FakeReq("d"), _FakeReq("e")
    s.last_mbs[2] = _FakeBatch([d], extend=True)
    regroup.on_scheduled(2, s.last_mbs[2])
    regroup.on_result(2)
    assert records[-1] == {"from_slot": 2, "running": [], "chosen": None}
    assert s.last_mbs[2] is None and [r.rid for r in s.running_mbs[2].reqs] == ["d"]
    assert s.running_mbs[2].is_prefill_only and regroup.held == {2}
    # Its next turn asks again: still no decode slot open, the hold stands (not recorded twice).
    regroup.before_schedule(2)
    assert len(records) == 2
    with pytest.raises(AssertionError, match="holds its requests"):
        regroup.on_scheduled(2, _FakeBatch([d]))       # SGLang must not decode a held slot
    # Slot 2 runs a prefill meanwhile; another request ends there: held too (recorded).
    s.last_mbs[2] = _FakeBatch([e], extend=True)
    regroup.on_scheduled(2, s.last_mbs[2])
    regroup.on_result(2)
    assert records[-1] == {"from_slot": 2, "running": [], "chosen": None} and len(records) == 3
    assert [r.rid for r in s.running_mbs[2].reqs] == ["d", "e"] and s.running_mbs[2].is_prefill_only
    # Slot 0's result opens it: the held requests join it there, before any further turn.
    regroup.on_result(0)
    assert [r.rid for r in s.running_mbs[0].reqs] == ["a", "b", "d", "e"]
    assert not s.running_mbs[0].is_prefill_only and s.running_mbs[2].is_empty()
    assert records[-1] == {"from_slot": 2, "running": [[0, 2]], "chosen": 0} and regroup.held == set()
    regroup.before_schedule(0)  # a decode slot keeps its own requests: nothing asked
    assert len(records) == 4 and regroup.num_moved == 2


def test_a_held_slot_whose_requests_are_aborted_or_finished_is_released_at_the_next_opening():
    """vpp-pack, P = 2 (decode slots 0 and 3). SGLang aborts a held request as a running one: it
    sets ``to_finish`` and the request stays in its slot's running batch (where SGLang's abort
    and idle checks read it) until a forward's result finishes it. Held, it has no forward: it
    joins the first decode slot that opens and finishes with that slot's decode (counted as
    aborted while held). A held batch emptied meanwhile (its requests finished and filtered)
    still leaves the hold at the next opening, its flag cleared: no slot stays held."""
    from types import SimpleNamespace

    from sglang_vpp.schedule import LinearAttentionCost, build_controller, build_layout, controller_config
    from sglang_vpp.sglang_plugin.vpp.decode_slots import DecodeRegrouper

    layout = build_layout(2, 8, "foldback")
    controller = build_controller(controller_config("vpp-pack", layout, 64, LinearAttentionCost(), 64))
    s = SimpleNamespace(chunked_req=None, running_batch=None, last_mbs=[None] * 6,
                        running_mbs=[_FakeBatch([_FakeReq("a")]), *(_FakeBatch() for _ in range(5))])
    s.running_mbs[3] = _FakeBatch([_FakeReq("x")])
    records = []
    regroup = DecodeRegrouper(s, controller, lambda **fields: records.append(fields))
    regroup.on_scheduled(0, s.running_mbs[0])
    regroup.on_scheduled(3, s.running_mbs[3])           # both decode batches in flight

    def end_prefill(slot: int, *reqs: _FakeReq) -> None:
        s.last_mbs[slot] = _FakeBatch(reqs, extend=True)
        regroup.on_scheduled(slot, s.last_mbs[slot])
        regroup.on_result(slot)

    d, e, f = _FakeReq("d"), _FakeReq("e"), _FakeReq("f")
    end_prefill(2, d, e)
    end_prefill(4, f)
    assert regroup.held == {2, 4} and [r["chosen"] for r in records] == [None, None]
    d.to_finish = e.to_finish = "abort"                  # Scheduler.abort_request on held requests
    f._finished = True                                   # finished another way: SGLang filters it
    s.running_mbs[4].filter_batch()
    regroup.before_schedule(2)
    regroup.before_schedule(4)
    # No decode slot open: still held, still in running_mbs (SGLang's abort and idle checks see them).
    assert regroup.held == {2, 4} and s.running_mbs[2].reqs == [d, e] and s.running_mbs[4].is_empty()
    assert s.running_mbs[4].is_prefill_only and len(records) == 2
    regroup.on_result(0)                                 # slot 0 opens: both held slots join it
    assert regroup.held == set() and [r.rid for r in s.running_mbs[0].reqs] == ["a", "d", "e"]
    assert records[-2:] == [{"from_slot": 2, "running": [[0, 1]], "chosen": 0},
                            {"from_slot": 4, "running": [[0, 3]], "chosen": 0}]
    assert not s.running_mbs[0].is_prefill_only       # slot 0 decodes them: the abort finishes there
    assert not s.running_mbs[2].is_prefill_only and not s.running_mbs[4].is_prefill_only
    assert regroup.num_aborted_while_held == 2
    # Nothing in flight: a request held meanwhile is released at the very next turn of any slot.
    regroup.on_scheduled(0, s.running_mbs[0])
    regroup.on_scheduled(3, s.running_mbs[3])
    end_prefill(5, _FakeReq("g"))
    assert regroup.held == {5}
    regroup.on_result(0)
    regroup.on_result(3)
    assert regroup.held == set() and regroup.in_flight == set()
    assert regroup.num_aborted_while_held == 2           # g was not aborted


def test_a_kv_pool_that_did_not_allocate_through_the_ownership_hooks_is_refused(monkeypatch):
    """An NPU, quantized or FP4 pool allocates the whole hull by its own code: more memory than was
    budgeted for the owned layers, refused once allocated, naming the pool class; each runner's
    allocation is judged on its own, and a draft worker is not checked."""
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp import ownership, state as vpp_state

    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2), rank=0)
    monkeypatch.setattr(vpp_state, "_STATE", state)
    runner = SimpleNamespace(is_draft_worker=False, token_to_kv_pool=type("NPUMHATokenToKVPool", (), {})())

    def bypassing(runner):
        return "allocated"

    def hooked(runner):
        state.kv_pools_owned += 1  # what _allocate_owned counts
        return "allocated"

    assert ownership.around_alloc_memory_pool(hooked, runner) == "allocated"
    with pytest.raises(VppConfigError, match=r"^--pp-mode vpp-pack: SGLang's KV pool NPUMHATokenToKVPool "
                                             r"allocated its buffers by code the plugin does not hook"):
        ownership.around_alloc_memory_pool(bypassing, runner)  # an earlier runner's pool does not count
    draft = SimpleNamespace(is_draft_worker=True, token_to_kv_pool=None)
    assert ownership.around_alloc_memory_pool(bypassing, draft) == "allocated"


@pytest.mark.parametrize("dtype", ["mxfp8", "nvfp4", "fp4_mx_block16"])
def test_kv_cache_dtypes_whose_pools_allocate_by_their_own_code_are_refused(dtype):
    import argparse

    from sglang_vpp.sglang_plugin.errors import PpModeError
    from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS, check_vpp_features

    base = {refusal.attr: None for refusal in VPP_REFUSALS}
    check_vpp_features(argparse.Namespace(**{**base, "kv_cache_dtype": "fp8_e4m3"}), "vpp")  # a hooked pool
    with pytest.raises(PpModeError, match=f"does not support --kv-cache-dtype \\(got '{dtype}'\\)"):
        check_vpp_features(argparse.Namespace(**{**base, "kv_cache_dtype": dtype}), "vpp")


def test_disabled_chunked_prefill_is_one_rule_at_launch_and_in_the_scheduler():
    """An unset --chunked-prefill-size (None in the launcher's Namespace) is a size SGLang resolves
    later, so neither launcher check refuses it; in SGLang's resolved arguments None and -1 both
    mean no chunked prefill. Every place words the refusal the same."""
    import argparse

    from sglang_vpp.sglang_plugin.errors import PpModeError
    from sglang_vpp.sglang_plugin.options import PipelineOptions
    from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS, validate_pipeline_args
    from sglang_vpp.sglang_plugin.vpp import _refuse_unsupported

    base = {refusal.attr: None for refusal in VPP_REFUSALS}
    unset = argparse.Namespace(**{**base, "pp_size": 2, "chunked_prefill_size": None})
    validate_pipeline_args(unset, PipelineOptions(pp_mode="vpp"))
    _refuse_unsupported(unset, "vpp")
    with pytest.raises(VppConfigError, match=r"chunked prefill is disabled \(--chunked-prefill-size None as "
                                             r"SGLang resolved it for this model and machine\)"):
        _refuse_unsupported(unset, "vpp", resolved=True)
    disabled = argparse.Namespace(**{**base, "pp_size": 2, "chunked_prefill_size": -1})
    with pytest.raises(PpModeError) as launcher:
        validate_pipeline_args(disabled, PipelineOptions(pp_mode="vpp"))
    with pytest.raises(VppConfigError) as scheduler:
        _refuse_unsupported(disabled, "vpp")
    assert str(launcher.value) == str(scheduler.value)
    assert "(--chunked-prefill-size -1); pass a positive --chunked-prefill-size" in str(launcher.value)


def test_a_refusal_in_a_scheduler_says_the_value_may_be_sglangs():
    """SGLang sets is_embedding for an embedding architecture and detects the device itself: the
    scheduler's message does not claim the user passed the flag."""
    import argparse

    from sglang_vpp.sglang_plugin.errors import PpModeError
    from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS
    from sglang_vpp.sglang_plugin.vpp import _refuse_unsupported

    base = {refusal.attr: None for refusal in VPP_REFUSALS}
    args = argparse.Namespace(**{**base, "is_embedding": True, "chunked_prefill_size": 64})
    with pytest.raises(PpModeError, match=r"--is-embedding \(got True as SGLang resolved it for this model and machine\)"):
        _refuse_unsupported(args, "vpp", resolved=True)


def test_a_model_with_deepseek_sparse_attention_is_refused_before_its_pool(monkeypatch):
    """SGLang gives a DSA model (a listed architecture with index_topk) an index-key cache that it
    allocates for the whole hull by its own code; refused after the model loads, before any pool,
    by SGLang's own test of the config (a dict at launch, its PretrainedConfig in a scheduler)."""
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp import ownership, state as vpp_state
    from sglang_vpp.sglang_plugin.vpp.sparse_attention import uses_sparse_attention_cache

    monkeypatch.setattr(vpp_state, "_STATE", VppState(config=VppConfig(mode="vpp-stream", pp_size=2), rank=0))
    dense = {"architectures": ["DeepseekV3ForCausalLM"]}
    sparse = {"architectures": ["DeepseekV3ForCausalLM"], "index_topk": 2048}
    assert not uses_sparse_attention_cache(dense) and uses_sparse_attention_cache(sparse)
    assert uses_sparse_attention_cache(SimpleNamespace(**sparse)) and not uses_sparse_attention_cache(SimpleNamespace(**dense))
    assert not uses_sparse_attention_cache({"architectures": ["Qwen3ForCausalLM"], "index_topk": 2048})
    model = type("DeepseekV3ForCausalLM", (), {})()
    runner = SimpleNamespace(is_draft_worker=False, model=model, model_config=SimpleNamespace(hf_config=sparse))
    with pytest.raises(VppConfigError, match=r"^--pp-mode vpp-stream does not support model DeepseekV3ForCausalLM "
                                             r"with DeepSeek sparse attention .* Use --pp-mode cpp or dcpp"):
        ownership.after_load_model(None, runner)


def test_grammar_readiness_rides_on_rank_0s_log_and_the_stock_p2p_never_runs():
    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp import grammar_sync
    from sglang_vpp.sglang_plugin.vpp.errors import SchedulerDivergenceError
    from sglang_vpp.sglang_plugin.vpp.replica import Replica, batch_signature

    def stock_p2p(manager, ready, failed):
        raise AssertionError("the stock PP send/receive ran under VPP")

    class GrammarWaitingScheduler:
        """get_next_batch_to_run as SGLang's: requests wait on their grammars, so the call syncs."""

        def __init__(self, own_view, rids):
            self.own_view, self.seen = own_view, []
            self.grammar_manager = SimpleNamespace(grammar_queue=[SimpleNamespace(rid=rid) for rid in rids])

        def get_next_batch_to_run(self, running_batch, last_batch):
            ready, failed = self.own_view
            self.seen.append(grammar_sync.around_pp_sync_ready_failed(
                stock_p2p, self.grammar_manager, set(ready), set(failed)))
            return SimpleNamespace(running_batch=running_batch, batch_to_run=None)

    try:
        # rank 0 found requests 0 and 2 ready, 1 timed out
        leader_scheduler = GrammarWaitingScheduler(({0, 2}, {1}), ["a", "b", "c"])
        leader = Replica(leader_scheduler, num_slots=3, rank=0)
        leader.grammar = grammar_sync.install_grammar_decisions(0)
        events = []
        for slot in (0, 1):  # a turn over two free slots: two calls before any follower replays
            batch = leader.schedule(slot)
            events += [*leader.grammar.take(), ("sched", slot, batch_signature(batch))]
        decision = ("grammar", [0, 2], [1], ["a", "b", "c"])
        assert events == [decision, ("sched", 0, None), decision, ("sched", 1, None)]
        assert leader_scheduler.seen == [({0, 2}, {1})] * 2

        follower_scheduler = GrammarWaitingScheduler((set(), set()), ["a", "b", "c"])  # compiles not done
        follower = Replica(follower_scheduler, num_slots=3, rank=1)
        follower.grammar = grammar_sync.install_grammar_decisions(1)
        for event in events:
            follower.replay(event)
        assert follower_scheduler.seen == [({0, 2}, {1})] * 2  # rank 0's decision, not its own
        with pytest.raises(SchedulerDivergenceError, match="carries no grammar decision"):
            follower.replay(("sched", 2, None))
        follower.replay(("grammar", [0], [], ["a"]))
        follower.grammar.queued.append(([1], [], ["b"]))  # one more than the call takes
        with pytest.raises(SchedulerDivergenceError, match="left 1 of rank 0's grammar decisions unused"):
            follower.replay(("sched", 2, None))
        follower.grammar.queued.clear()
        follower.replay(("grammar", [0, 2], [], ["a", "x"]))  # rank 0's queue held another request there
        with pytest.raises(SchedulerDivergenceError, match=r"requests \['a', 'x'\].*holds \['a', 'c'\]"):
            follower.replay(("sched", 2, None))
    finally:
        grammar_sync._decisions = None  # noqa: SLF001 - the hook is per process; leave none behind


@pytest.mark.parametrize("jobs,waiting,idles", [({}, False, True), ({}, True, False), ({7: object()}, False, False)])
def test_leader_build_logs_each_grammar_decision_before_its_call_and_idles_only_with_nothing_pending(
        jobs, waiting, idles):
    """``LeaderLoop._build`` over a turn of free slots that builds nothing: each call's grammar
    decision precedes its ``sched`` event (a follower takes it in that call), and the loop goes idle
    only with nothing in flight and no grammar compiling (a finished compile sends no request)."""
    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp.event_loop import LeaderLoop

    calls = []

    def schedule(slot):
        calls.append(slot)
        pending.append(("grammar", [slot], [], [f"r{slot}"]))
        return None

    def take():
        taken = list(pending)
        pending.clear()
        return taken

    pending: list[tuple] = []
    loop = object.__new__(LeaderLoop)
    loop.idle, loop.num_slots, loop.cursor, loop.slot_seq, loop.events, loop.jobs = False, 3, 1, [None] * 3, [], jobs
    loop.replica = SimpleNamespace(auto=None, schedule=schedule, grammar=SimpleNamespace(take=take))
    loop.s = SimpleNamespace(grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: waiting))
    entered = []
    loop._enter_idle = lambda: entered.append(True)  # noqa: SLF001 - the rule under test reads it
    assert loop._build() is None  # noqa: SLF001
    assert calls == [1, 2, 0] and loop.cursor == 1  # stock PP's slot order, from the cursor round
    assert loop.events == [event for slot in (1, 2, 0)
                           for event in (("grammar", [slot], [], [f"r{slot}"]), ("sched", slot, None))]
    assert entered == ([True] if idles else [])
    loop.slot_seq[2] = 5  # a slot still in flight stops the turn there
    loop.events.clear()
    calls.clear()
    assert loop._build() is None and calls == [1] and loop.cursor == 2  # noqa: SLF001


@pytest.mark.parametrize("comm_timeout_s", [0.5, 1.0, 300.0])
def test_an_idle_leader_heartbeats_within_the_comm_timeout(monkeypatch, comm_timeout_s):
    """An idle follower waits ``--vpp-comm-timeout`` for its next message, and an idle rank 0's
    heartbeats are all that come: they must come more often than that timeout, whatever value
    in (0 s, a week] it was given, or an idle server ends itself with ``CommTimeoutError``."""
    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from sglang_vpp.sglang_plugin.vpp import event_loop
    from sglang_vpp.sglang_plugin.vpp.event_loop import LeaderLoop

    now = [100.0]
    monkeypatch.setattr(event_loop, "time", SimpleNamespace(
        monotonic=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)))
    sent = []
    loop = object.__new__(LeaderLoop)
    loop.config = VppConfig(mode="vpp", pp_size=2, comm_timeout_s=comm_timeout_s)
    loop.events, loop.held, loop.idle, loop.blocking, loop.last_fwd_send = [], None, True, True, now[0]
    loop.fwd_out = SimpleNamespace(send=lambda message, blocking: sent.append(now[0]))
    loop._ingest = lambda: None  # noqa: SLF001 - no request comes: the loop stays idle
    while now[0] < 100.0 + 3 * min(comm_timeout_s, loop.config.heartbeat_s) + 0.1:
        loop._idle_poll()  # noqa: SLF001
    gaps = [later - earlier for earlier, later in zip([100.0, *sent], sent)]
    assert sent and max(gaps) < comm_timeout_s


def test_the_heartbeat_default_is_one_constant(monkeypatch):
    """``VppConfig``'s field and ``from_env`` without SGLANG_VPP_HEARTBEAT_S give the same default;
    the variable still overrides it."""
    from sglang_vpp.sglang_plugin.vpp import state

    monkeypatch.delenv("SGLANG_VPP_HEARTBEAT_S", raising=False)
    assert VppConfig("vpp", 2).heartbeat_s == state.DEFAULT_HEARTBEAT_S == 1.0
    monkeypatch.setattr(state, "DEFAULT_HEARTBEAT_S", 2.5)  # from_env reads the constant, not a copy of it
    assert VppConfig.from_env("vpp", 2, None).heartbeat_s == 2.5
    monkeypatch.setenv("SGLANG_VPP_HEARTBEAT_S", "0.25")
    assert VppConfig.from_env("vpp", 2, None).heartbeat_s == 0.25
