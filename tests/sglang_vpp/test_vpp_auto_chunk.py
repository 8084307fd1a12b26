"""``--chunked-prefill-size auto`` without a server: parsing, the server's chunk cuts, the trace
records and their replay by ``check --trace``."""

from __future__ import annotations

import argparse
import functools
import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.schedule import split_request
from sglang_vpp.schedule.auto_size import AutoChunker
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args, check_namespace
from sglang_vpp.sglang_plugin.accounting import RankAccounting
from sglang_vpp.sglang_plugin.errors import PpModeError
from sglang_vpp.trace_records import CHUNK
from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS
from sglang_vpp.sglang_plugin.vpp import chunk_sizing, state as vpp_state
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunked-prefill-size", type=int, default=None)  # SGLang's flag
    parser.add_argument("--pp-size", type=int, default=1)
    add_pipeline_args(parser)
    # Every flag VPP refuses exists on SGLang's ServerArgs (the plugin checks that), off here.
    parser.set_defaults(**{refusal.attr: None for refusal in VPP_REFUSALS})
    return parser


def test_auto_gives_sglang_the_cap_and_the_plugin_the_flag():
    args = _parser().parse_args(["--chunked-prefill-size", "auto", "--pp-mode", "vpp-pack", "--pp-size", "2"])
    options = check_namespace(args)
    assert args.chunked_prefill_size == SERVER_CAP and options.vpp_auto_chunk
    plain = _parser().parse_args(["--chunked-prefill-size", "512", "--pp-mode", "vpp-pack", "--pp-size", "2"])
    assert plain.chunked_prefill_size == 512 and not check_namespace(plain).vpp_auto_chunk
    stock = _parser().parse_args(["--chunked-prefill-size", "auto", "--pp-mode", "cpp", "--pp-size", "2"])
    with pytest.raises(PpModeError, match="auto is sized by the VPP controller.*--pp-mode cpp"):
        check_namespace(stock)


def _server(monkeypatch, cap: int = 256) -> tuple[VppState, object, list[dict]]:
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True), rank=0)
    state.ensure_layout(8)
    monkeypatch.setattr(vpp_state, "_STATE", state)
    monkeypatch.setattr(chunk_sizing, "_sizer", None)
    scheduler = SimpleNamespace(chunked_prefill_size=cap, max_prefill_tokens=16384, chunked_req=None,
                                dynamic_chunk_sizer=None)
    controller = state.build_controller(cap)
    assert isinstance(controller.chunker, AutoChunker)
    # The loop's own recorder (event_loop.py), so a kind the schema does not know fails here.
    acct = RankAccounting(0, "unused-trace-dir")
    records = acct.decisions
    controller.chunker.on_choice = functools.partial(acct.decision, CHUNK)
    chunk_sizing.install_chunk_sizer(scheduler, controller)
    return state, scheduler, records


def _serve(scheduler, length: int) -> list[int]:
    """Cut one request as SGLang does with the plugin's hooks (first chunk, then the sizer slot)."""
    sizer = scheduler.dynamic_chunk_sizer
    req = SimpleNamespace(prefix_len=0, origin_input_ids=[1] * length, output_ids=[])

    def admit(adder, request, *args, **kwargs):
        remaining = len(request.origin_input_ids) - request.prefix_len
        take = min(adder.rem_chunk_tokens, remaining)
        adder.rem_chunk_tokens -= take
        adder.new_chunked_req = request if take < remaining else None
        adder.taken = take

    adder = SimpleNamespace(rem_chunk_tokens=scheduler.chunked_prefill_size, new_chunked_req=None, can_run_list=[])
    chunk_sizing.around_add_one_req(admit, adder, req, has_chunked_req=False, truncation_align_size=None)
    cut = [adder.taken]
    scheduler.chunked_req = req
    while sum(cut) < length:
        req.prefix_len = sum(cut)
        cut.append(min(sizer.predict(req.prefix_len), length - req.prefix_len))
    scheduler.chunked_req = None
    return cut


def test_the_server_cuts_the_chunks_the_auto_chunker_plans(monkeypatch):
    state, scheduler, _ = _server(monkeypatch)
    controller = state.build_controller(256)
    for length in (100, 700, 3000):
        planned = [size for _, size in split_request(controller.chunker, length)]
        assert _serve(scheduler, length) == planned
        assert max(planned) <= 256


def test_check_trace_replays_the_auto_sizes(monkeypatch, tmp_path):
    state, scheduler, records = _server(monkeypatch)
    for length in (700, 3000):
        _serve(scheduler, length)
    assert records, "the auto chunker recorded no size"
    inputs = state.controller_inputs(scheduler.dynamic_chunk_sizer.controller)
    assert inputs["auto_chunk_cap"] == 256

    def write(decisions):
        for rank in (0, 1):
            (tmp_path / f"vpp_rank{rank}.records.json").write_text(json.dumps(
                {"records": [], "counters": {}, "controller": inputs, "decisions": decisions if rank == 0 else []}))
        return str(tmp_path)

    result = CliRunner().invoke(app, ["check", "--trace", write(records)])
    assert result.exit_code == 0, result.output
    wrong = [dict(r) for r in records]
    wrong[0]["size"] += 1
    result = CliRunner().invoke(app, ["check", "--trace", write(wrong)])
    assert result.exit_code == 1
    assert f"controller expected a chunk of {records[0]['size']} tokens" in result.output


def test_bench_serve_launch_passes_auto_to_vpp_modes_and_the_cap_to_stock(tmp_path):
    from sglang_vpp.cli.bench_serve_launch import LaunchSpec

    spec = LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size="auto")
    commands = {mode: spec.config(mode, tmp_path).command(30000) for mode in ("cpp", "dcpp", "vpp-pack")}
    size = {mode: cmd[cmd.index("--chunked-prefill-size") + 1] for mode, cmd in commands.items()}
    assert size == {"cpp": str(SERVER_CAP), "dcpp": str(SERVER_CAP), "vpp-pack": "auto"}


def test_on_cpu_the_estimate_carries_the_measured_host_gap_so_auto_chunks_are_not_the_smallest():
    from sglang_vpp.schedule.cpu_cost import HOST_GAP_PER_FORWARD_S, HOST_GAP_RANGE_S, STAGE_CALL_S
    from sglang_vpp.schedule.fitted_cost import FittedCostModel
    from sglang_vpp.serving.decision_replay import _build_controller

    def controller(on_cpu: bool):
        state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True, on_cpu=on_cpu), rank=0)
        state.ensure_layout(8)
        return state, state.build_controller(SERVER_CAP)

    state, cpu = controller(True)
    assert isinstance(cpu.cost, FittedCostModel)
    assert HOST_GAP_RANGE_S[0] <= HOST_GAP_PER_FORWARD_S <= HOST_GAP_RANGE_S[1]
    assert all(c.d == STAGE_CALL_S + HOST_GAP_PER_FORWARD_S for c in cpu.cost.stages.values())
    assert "host time per forward" in state.cost_source()
    rebuilt = _build_controller(state.controller_inputs(cpu), rank=0)  # check --trace rebuilds it
    assert rebuilt.cost == cpu.cost
    _, generic = controller(False)
    smallest = min(generic.chunker.sizer.candidates)
    # Without a per-forward cost every extra chunk looks free; with the measured CPU costs an
    # 8000-token prompt (served in 512-token chunks it took 5x cpp's makespan) gets large chunks.
    assert generic.chunker.sizer.choose((8000,)).chunk_size == smallest
    assert cpu.chunker.sizer.choose((8000,)).chunk_size >= 4096
