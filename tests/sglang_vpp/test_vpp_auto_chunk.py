"""``--chunked-prefill-size auto`` without a server: parsing, the server's chunk cuts, the trace
records and their replay by ``check --trace``."""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from sglang_harness import SKIP_NO_SGLANG
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.plan_process import PLANNER_NICENESS, ProcessPlanner, ThreadPlanner, planner_for, sizer_bytes
from sglang_vpp.schedule import split_request
from sglang_vpp.schedule.auto_size import AutoChunker
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args, check_namespace
from sglang_vpp.sglang_plugin.accounting import RankAccounting
from sglang_vpp.sglang_plugin.errors import PpModeError
from sglang_vpp.trace_records import CHUNK, RESIZE
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


def test_a_size_that_is_neither_an_integer_nor_auto_names_both(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--chunked-prefill-size", "4k", "--pp-mode", "vpp-pack"])
    assert "argument --chunked-prefill-size: invalid int or 'auto' value: '4k'" in capsys.readouterr().err


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


def test_a_trace_from_a_server_whose_auto_weighed_no_tapered_cut_still_replays(monkeypatch, tmp_path):
    """The controller inputs say whether auto weighed the tapered cut (``auto_taper``). A trace
    without the field replays with the mode's own cut only, so its fixed cuts still replay; the
    same cuts under inputs that say the taper was weighed fail, where the taper cuts otherwise
    (the analytic estimate, no per-forward cost: 256 tapered, ramps of 128)."""
    from sglang_vpp.schedule import build_layout, get_policy
    from sglang_vpp.schedule.factory import build_controller, server_controller_config
    from sglang_vpp.serving.decision_replay import _cost_model

    state, scheduler, _ = _server(monkeypatch, cap=16384)
    inputs = state.controller_inputs(scheduler.dynamic_chunk_sizer.controller)
    assert inputs["auto_taper"] is True
    policy = get_policy("vpp-pack")
    untapered = build_controller(server_controller_config(
        policy, build_layout(2, 8, policy.layout_kind), 16384, _cost_model(inputs["cost"]), auto_chunk=True,
        auto_taper=False))
    records: list[dict] = []
    untapered.chunker.on_choice = lambda **fields: records.append({"kind": CHUNK, **fields})
    old_cuts = [size for _, size in split_request(untapered.chunker, 1500)]
    new_cuts = [size for _, size in split_request(scheduler.dynamic_chunk_sizer.controller.chunker, 1500)]
    assert old_cuts != new_cuts and min(new_cuts) < min(old_cuts)

    def write(controller_inputs, where):
        where.mkdir()
        for rank in (0, 1):
            (where / f"vpp_rank{rank}.records.json").write_text(json.dumps(
                {"records": [], "counters": {}, "controller": controller_inputs,
                 "decisions": records if rank == 0 else []}))
        return str(where)

    old = {key: value for key, value in inputs.items() if key != "auto_taper"}
    result = CliRunner().invoke(app, ["check", "--trace", write(old, tmp_path / "old")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["check", "--trace", write(inputs, tmp_path / "new")])
    assert result.exit_code == 1 and f"server did {old_cuts[0]}" in result.output, result.output


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


class _Scheduler(SimpleNamespace):
    """The scheduler state ``auto`` reads: the request being chunked and the waiting queue."""


def _request(length: int, rid: str = "r") -> SimpleNamespace:
    return SimpleNamespace(rid=rid, prefix_len=0, origin_input_ids=[1] * length, output_ids=[])


_OPEN: list = []
"""Situation reporters the test made; each is closed after it (no planner process outlives a test)."""


@pytest.fixture(autouse=True)
def _close_planners():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _ranks(monkeypatch, waiting: list, decodes: bool = False, make_planner=planner_for) -> list:
    """Rank 0 and rank 1 of an auto server (SGLang's cap; by default the prefill server of a
    prefill-decode split), each its scheduler replica, controller, situation reporter and
    decision log."""
    ranks = []
    for rank in (0, 1):
        state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True, on_cpu=True), rank=rank)
        state.ensure_layout(8)
        controller = state.build_controller(SERVER_CAP, decodes=decodes)
        acct = RankAccounting(rank, "unused-trace-dir")
        controller.chunker.on_choice = functools.partial(acct.decision, CHUNK)
        scheduler = _Scheduler(chunked_prefill_size=SERVER_CAP, max_prefill_tokens=SERVER_CAP, chunked_req=None,
                               dynamic_chunk_sizer=None, waiting_queue=list(waiting))
        situation = chunk_sizing.AutoSituation(scheduler, controller, functools.partial(acct.decision, RESIZE),
                                               make_planner)
        _OPEN.append(situation)
        ranks.append(SimpleNamespace(state=state, controller=controller, scheduler=scheduler, acct=acct,
                                     situation=situation))
    monkeypatch.setattr(chunk_sizing, "_sizer", None)
    return ranks


def _form_batch(scheduler, controller) -> list[int]:
    """SGLang's prefill adder over the waiting queue with the plugin's hook: whole requests while
    they fit the budget, the first that does not is cut to the rest (it then waits chunked)."""
    chunk_sizing.install_chunk_sizer(scheduler, controller)

    def admit(adder, request, *args, **kwargs):
        remaining = len(request.origin_input_ids) - request.prefix_len
        take = min(adder.rem_chunk_tokens, remaining)
        adder.rem_chunk_tokens -= take
        adder.can_run_list.append(take)
        adder.new_chunked_req = request if take < remaining else None

    adder = SimpleNamespace(rem_chunk_tokens=scheduler.chunked_prefill_size, new_chunked_req=None, can_run_list=[])
    for req in list(scheduler.waiting_queue):
        if adder.rem_chunk_tokens <= 0:
            break
        chunk_sizing.around_add_one_req(admit, adder, req, has_chunked_req=False, truncation_align_size=None)
        scheduler.waiting_queue.remove(req)
        if adder.new_chunked_req is not None:
            break
    return adder.can_run_list


def test_a_burst_of_short_prompts_is_batched_at_the_size_the_controller_chose(monkeypatch):
    """Rank 0 tells the controller the 8 waiting prompts; the batch is cut at the size it chose
    (not SGLang's 16384 cap), and rank 1, replaying the event, forms the same batch."""
    burst = [_request(300, f"r{i}") for i in range(8)]
    leader, follower = _ranks(monkeypatch, burst)
    events: list = []
    leader.situation.before_schedule(events)
    [(kind, lengths, size, tapered, seen)] = events
    assert kind == chunk_sizing.AUTO_EVENT and lengths == seen == (300,) * 8 and tapered is False
    plan = leader.controller.chunker.sizer.choose(lengths)
    assert size == plan.chunk_size < SERVER_CAP  # the schedule core's choice, not the cap
    leader.situation.before_schedule(events)  # nothing changed: nothing to tell again
    assert len(events) == 1
    batch = _form_batch(leader.scheduler, leader.controller)
    assert sum(batch) == min(size, 8 * 300) and len(batch) < 8
    follower.situation.replay(events[0], rank=1)
    assert _form_batch(follower.scheduler, follower.controller) == batch
    leader.situation.before_schedule(events)  # requests only left the situation: the answer holds
    assert len(events) == 1
    leader.scheduler.waiting_queue.append(_request(900, "late"))
    leader.situation.before_schedule(events)  # one arrived: planned off the loop, in a process
    assert isinstance(leader.situation.planner, ProcessPlanner) and follower.situation.planner is None
    planned = leader.situation.told
    assert planned[-1] == 900 and len(events) == 1
    leader.situation.wait(timeout_s=60)
    leader.situation.before_schedule(events)  # the answer applies before the next batch
    assert len(events) == 2 and events[1][1] == planned and events[1][4] == planned
    assert events[1][2] == leader.controller.auto_size == leader.controller.chunker.sizer.choose(planned).chunk_size
    assert leader.acct.decisions[0] == follower.acct.decisions[0] == {"kind": RESIZE, "lengths": [300] * 8,
                                                                      "size": size, "tapered": False}


def test_a_later_situation_is_planned_off_the_loop_one_at_a_time(monkeypatch):
    """Rank 0's loop does not wait for a plan after the first: it forms batches at the size in
    force, plans one situation at a time, and applies each answer before the next batch, with
    what its scheduler holds then for the other ranks to check."""
    import threading

    leader, follower = _ranks(monkeypatch, [_request(300, f"r{i}") for i in range(8)], make_planner=ThreadPlanner)
    events: list = []
    leader.situation.before_schedule(events)
    follower.situation.replay(events[0], rank=1)
    first = events[0][2]
    release, asked = threading.Event(), []
    plan = leader.controller.auto_plan

    def slow_plan(lengths):
        asked.append(tuple(lengths))
        assert release.wait(60)
        return plan(lengths)

    monkeypatch.setattr(leader.controller, "auto_plan", slow_plan)
    for rank in (leader, follower):
        rank.scheduler.waiting_queue.append(_request(6000, "long"))
    leader.situation.before_schedule(events)
    for rank in (leader, follower):
        rank.scheduler.waiting_queue.append(_request(7000, "longer"))
    leader.situation.before_schedule(events)  # a plan is running: no second one, no waiting
    assert len(events) == 1 and leader.controller.auto_size == first
    assert leader.controller.next_chunk_size(0, 6000) == min(first, 6000)
    release.set()
    leader.situation.wait(timeout_s=60)
    leader.situation.before_schedule(events)  # the answer applies; the newer situation is planned
    leader.situation.wait(timeout_s=60)
    leader.situation.before_schedule(events)
    assert asked == [(300,) * 8 + (6000,), (300,) * 8 + (6000, 7000)]
    assert [e[1] for e in events[1:]] == asked
    assert [e[4] for e in events[1:]] == [(300,) * 8 + (6000, 7000)] * 2
    for event in events[1:]:
        follower.situation.replay(event, rank=1)
    assert follower.controller.auto_size == leader.controller.auto_size == events[-1][2]
    resizes = [[d for d in rank.acct.decisions if d["kind"] == RESIZE] for rank in (leader, follower)]
    assert len(resizes[0]) == 3 and resizes[0] == resizes[1]


def _pid_of(planner: ProcessPlanner, timeout_s: float = 60.0) -> int:
    """The child's pid, once it has loaded its sizer."""
    planner.started.result(timeout=timeout_s)
    return planner.pid


def _gone(pid: int) -> bool:
    """The process is reaped (a zombie would still answer signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_stuck_planner_is_stopped_and_a_fresh_one_plans(monkeypatch, caplog):
    """A planner child that gives no answer (here stopped by a signal) is killed once its plan
    has run past the bound; the size in force stays, and a fresh child plans the situation."""
    leader, _ = _ranks(monkeypatch, [_request(300, f"r{i}") for i in range(8)])
    events: list = []
    leader.situation.before_schedule(events)
    first, stuck = events[0][2], leader.situation.planner
    stuck_pid = _pid_of(stuck)
    os.kill(stuck_pid, signal.SIGSTOP)
    leader.scheduler.waiting_queue.append(_request(6000, "long"))
    leader.situation.before_schedule(events)  # submitted to the stopped child
    leader.situation.wait(timeout_s=0.5)
    assert len(events) == 1
    leader.situation.plan_timeout_s = 0.0
    with caplog.at_level("ERROR"):
        leader.situation.before_schedule(events)
    assert "gave no answer" in caplog.text and f"process {stuck_pid}" in caplog.text
    assert _gone(stuck_pid)
    fresh = leader.situation.planner
    assert isinstance(fresh, ProcessPlanner) and fresh is not stuck and leader.controller.auto_size == first
    leader.situation.plan_timeout_s = chunk_sizing.PLAN_TIMEOUT_S
    leader.situation.wait(timeout_s=60)
    leader.situation.before_schedule(events)
    assert len(events) == 2 and events[1][1] == (300,) * 8 + (6000,)


def test_the_planner_process_answers_as_the_loop_would(monkeypatch):
    """Several situations planned in the child: each answer equals the plan of an equal sizer in
    this process."""
    leader, follower = _ranks(monkeypatch, [_request(300, f"r{i}") for i in range(4)])
    twin = vpp_state.VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True, on_cpu=True), rank=0)
    twin.ensure_layout(8)
    in_loop = twin.build_controller(SERVER_CAP, decodes=False).chunker.sizer  # plans here, in this process
    events: list = []
    leader.situation.before_schedule(events)
    for length in (5000, 700, 12000):
        for rank in (leader, follower):
            rank.scheduler.waiting_queue.append(_request(length, f"n{length}"))
        leader.situation.before_schedule(events)
        leader.situation.wait(timeout_s=120)
        leader.situation.before_schedule(events)
    assert isinstance(leader.situation.planner, ProcessPlanner)
    assert len(events) == 4
    for _, lengths, size, tapered, _ in events:
        choice = in_loop.choose(lengths)
        assert (size, tapered) == (choice.chunk_size, choice.tapered)
    assert leader.situation.planner.submit(events[-1][1]).result(timeout=120) == in_loop.choose(events[-1][1])


def test_a_plan_that_raises_in_the_child_raises_in_the_loop(monkeypatch):
    from sglang_vpp.schedule.errors import ChunkingError

    leader, _ = _ranks(monkeypatch, [_request(300)])
    events: list = []
    leader.situation.before_schedule(events)
    leader.scheduler.waiting_queue.append(SimpleNamespace(rid="empty", prefix_len=0, origin_input_ids=[], output_ids=[]))
    leader.situation.before_schedule(events)
    leader.situation.wait(timeout_s=120)
    with pytest.raises(ChunkingError, match="auto needs prompt lengths >= 1 token, got \\[300, 0\\]"):
        leader.situation.before_schedule(events)


def test_a_killed_planner_process_is_a_clear_error_not_a_hang(monkeypatch):
    from sglang_vpp.plan_process import PlannerDiedError

    leader, _ = _ranks(monkeypatch, [_request(300)])
    events: list = []
    leader.situation.before_schedule(events)
    pid = _pid_of(leader.situation.planner)
    os.kill(pid, signal.SIGKILL)
    leader.scheduler.waiting_queue.append(_request(9000, "late"))
    leader.situation.before_schedule(events)
    leader.situation.wait(timeout_s=60)
    assert leader.situation._planning is not None and leader.situation._planning[1].done()  # bounded
    with pytest.raises(PlannerDiedError, match=f"auto planner process \\(pid {pid}\\) died while planning the "
                                               "chunk size for 2 prompts"):
        leader.situation.before_schedule(events)


def test_closing_ends_the_planner_process_even_mid_plan(monkeypatch):
    leader, _ = _ranks(monkeypatch, [_request(300)])
    events: list = []
    leader.situation.before_schedule(events)
    planner = leader.situation.planner
    pid = _pid_of(planner)
    # Below the loop's priority, so a loop that shares its CPU with the plan runs first.
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + PLANNER_NICENESS)
    leader.scheduler.waiting_queue.extend(_request(4096 + 97 * i, f"n{i}") for i in range(32))
    leader.situation.before_schedule(events)  # a plan of 33 prompts is running in the child
    started = time.monotonic()
    leader.situation.close()
    assert time.monotonic() - started < 30 and _gone(pid) and leader.situation.planner is None
    leader.situation.close()  # twice is harmless


def test_the_leader_loop_closes_the_planner_when_it_ends():
    """``LeaderLoop.run`` closes the situation reporter whether the loop exits or fails."""
    from sglang_vpp.sglang_plugin.vpp.event_loop import LeaderLoop

    closed = []
    auto = SimpleNamespace(close=lambda: closed.append(True))

    def fails():
        raise RuntimeError("a rank failed")

    with pytest.raises(RuntimeError, match="a rank failed"):
        LeaderLoop.run(SimpleNamespace(_run=fails, replica=SimpleNamespace(auto=auto)))
    LeaderLoop.run(SimpleNamespace(_run=lambda: None, replica=SimpleNamespace(auto=auto)))
    assert closed == [True, True]


def test_a_sizer_that_does_not_pickle_plans_on_a_thread_and_says_why(monkeypatch, caplog):
    [leader, _] = _ranks(monkeypatch, [_request(300)])
    sizer = leader.controller.chunker.sizer
    mode_chunkers = sizer.chunker_for
    monkeypatch.setattr(sizer, "chunker_for", lambda size, length: mode_chunkers(size, length))
    with caplog.at_level("WARNING"):
        planner = planner_for(leader.controller)
    try:
        assert isinstance(planner, ThreadPlanner)
        assert "planning on a worker thread" in caplog.text and "pickle" in caplog.text
        assert planner.submit((300, 900)).result(timeout=120).chunk_size == sizer.choose((300, 900)).chunk_size
    finally:
        planner.close()


def test_the_planner_modules_import_neither_torch_nor_sglang():
    """What the parent side imports in the scheduler process, and the child's own module."""
    code = ("import sys, sglang_vpp.plan_process, sglang_vpp.plan_child; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang', 'numpy')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


_PARENT_SCRIPT = """
import heavy_marker  # stands in for SGLang's launcher module: the parent's __main__ imports it
import json, sys
import sglang
from sglang_vpp.plan_process import ProcessPlanner, sizer_bytes
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState

if __name__ == "__main__":
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True, on_cpu=True), rank=0)
    state.ensure_layout(8)
    sizer = state.build_controller(SERVER_CAP, decodes=False).chunker.sizer
    planner = ProcessPlanner(sizer_bytes(sizer))
    try:
        modules, found = planner.modules().result(timeout=120)
        chunk = planner.submit((300, 5000)).result(timeout=120).chunk_size
    finally:
        planner.close()
    print(json.dumps({"modules": modules, "found": found, "chunk": chunk,
                      "expected": sizer.choose((300, 5000)).chunk_size, "mine": sys.modules["sglang_vpp"].__file__}))
"""


@SKIP_NO_SGLANG  # the parent imports it, as a server's does
def test_the_planner_process_imports_the_schedule_core_not_the_parents_main_nor_sglang(tmp_path):
    """A parent run as a script that imports sglang and a marker module: the child has neither
    (nor torch), found ``sglang_vpp`` where the parent did (this tree, by the parent's path), and
    plans as the parent would."""
    (tmp_path / "heavy_marker.py").write_text("")
    script = tmp_path / "launcher.py"
    script.write_text(_PARENT_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    modules = set(answer["modules"])
    assert "sglang_vpp.schedule.auto_size" in modules and "sglang_vpp.plan_wire" in modules
    banned = sorted(m for m in modules if m.split(".")[0] in ("heavy_marker", "sglang", "torch", "__mp_main__"))
    assert not banned, banned
    assert answer["found"] == answer["mine"]
    assert answer["chunk"] == answer["expected"]


def test_a_sizer_made_of_something_in_main_plans_on_a_thread(monkeypatch, caplog):
    """The child's ``__main__`` is its own module, so a class of the parent's ``__main__`` would
    not load there: refused when the sizer is pickled, which plain ``pickle`` would allow."""
    import pickle

    [leader, _] = _ranks(monkeypatch, [_request(300)])
    sizer = leader.controller.chunker.sizer
    in_main = type("InMain", (), {"__module__": "__main__"})
    monkeypatch.setattr(sys.modules["__main__"], "InMain", in_main, raising=False)
    monkeypatch.setattr(sizer, "note", in_main(), raising=False)
    pickle.dumps(sizer)  # pickle alone accepts it
    with caplog.at_level("WARNING"):
        planner = planner_for(leader.controller)
    try:
        assert isinstance(planner, ThreadPlanner)
        assert "InMain is defined in __main__, which the planner process does not import" in caplog.text
    finally:
        planner.close()


def _dead(pid: int) -> bool:
    """Gone or a zombie (its new parent may be slow to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_planner_process_dies_with_its_parent_even_mid_plan(tmp_path):
    """The parent is killed while the child plans (so the child reads no end of its input):
    the kernel ends the child too."""
    (tmp_path / "slow_sizer.py").write_text(
        "import time\nclass SlowSizer:\n    def choose(self, lengths):\n        time.sleep(300)\n")
    script = ("import sys, time; sys.path[:0] = sys.argv[1:]; "
              "from slow_sizer import SlowSizer; "
              "from sglang_vpp.plan_process import ProcessPlanner, sizer_bytes; "
              "p = ProcessPlanner(sizer_bytes(SlowSizer())); p.started.result(timeout=120); p.submit((1,)); "
              "time.sleep(0.5); print(p.pid, flush=True); time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path), *sys.path], stdout=subprocess.PIPE,
                              text=True)
    try:
        child = int(parent.stdout.readline())
        assert not _dead(child)
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not _dead(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _dead(child)


def test_a_planner_process_whose_parent_is_another_exits_at_once():
    """Its parent died before the child asked to die with it (the child was adopted): it exits,
    without waiting for input that will never come."""
    # 0: no process's parent in its own pid namespace (1 would be pytest's own pid in a container).
    child = subprocess.Popen([sys.executable, "-m", "sglang_vpp.plan_child", "0", "0"], stdin=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.wait(timeout=60) == 1
    finally:
        child.kill()
        child.stdin.close()
        child.wait(timeout=30)


def test_closing_a_planner_that_is_still_starting_leaves_no_process():
    planner = ProcessPlanner(sizer_bytes(None))
    pid = planner.pid
    answer = planner.submit((300,))
    planner.close()
    assert _gone(pid) and answer.done()
    with pytest.raises(RuntimeError, match="the auto planner was closed"):
        planner.submit((300,))


def test_a_server_that_also_decodes_batches_new_requests_at_its_cap(monkeypatch):
    """Where the server decodes, the size still cuts long prompts, but a batch of new requests
    keeps SGLang's budget: the plan is of prefill only, and small batches spread decode."""
    leader, follower = _ranks(monkeypatch, [_request(300, f"r{i}") for i in range(8)], decodes=True)
    events: list = []
    leader.situation.before_schedule(events)
    [(_, _, size, _, _)] = events
    assert size < 8 * 300
    assert _form_batch(leader.scheduler, leader.controller) == [300] * 8
    follower.situation.replay(events[0], rank=1)
    assert _form_batch(follower.scheduler, follower.controller) == [300] * 8
    assert follower.controller.next_chunk_size(0, 5000) == leader.controller.next_chunk_size(0, 5000) == size


def test_a_rank_whose_scheduler_sees_another_situation_stops(monkeypatch):
    from sglang_vpp.sglang_plugin.vpp.errors import SchedulerDivergenceError

    leader, follower = _ranks(monkeypatch, [_request(300), _request(900)])
    events: list = []
    leader.situation.before_schedule(events)
    follower.scheduler.waiting_queue.pop()
    with pytest.raises(SchedulerDivergenceError, match="rank 0 sized a batch for prompts of \\[300, 900\\]"):
        follower.situation.replay(events[0], rank=1)


def test_the_request_being_chunked_leads_the_situation(monkeypatch):
    [leader, _] = _ranks(monkeypatch, [_request(300)])
    leader.scheduler.chunked_req = _request(5000)
    assert chunk_sizing.situation(leader.scheduler, leader.controller.auto_window) == (5000, 300)
    assert chunk_sizing.situation(leader.scheduler, 1) == (5000,)
    leader.scheduler.chunked_req, leader.scheduler.waiting_queue = None, []
    events: list = []
    leader.situation.before_schedule(events)  # nothing to size
    assert events == [] and leader.controller.auto_size is None


def _write_trace(tmp_path, inputs: dict, decisions: dict[int, list]) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        (tmp_path / f"vpp_rank{rank}.records.json").write_text(json.dumps(
            {"records": [], "counters": {}, "controller": inputs, "decisions": decisions.get(rank, [])}))
    return str(tmp_path)


def _served_burst(monkeypatch) -> tuple[dict, dict[int, list], int]:
    """Both ranks' records of a burst of 8 x 300 tokens, then a 5000-token prompt, served."""
    from sglang_vpp.trace_records import ADMIT, LEFT, micro_batch_record
    from sglang_vpp.schedule import Admission, MicroBatch

    leader, follower = _ranks(monkeypatch, [_request(300, f"r{i}") for i in range(8)])
    events: list = []
    leader.situation.before_schedule(events)
    batch = _form_batch(leader.scheduler, leader.controller)
    follower.situation.replay(events[0], rank=1)
    _form_batch(follower.scheduler, follower.controller)
    mb = MicroBatch(0, frozenset({"r0", "r1"}), 0, sum(batch), True)
    leader.acct.decision(ADMIT, decision=str(leader.controller.admission(mb)), **micro_batch_record(mb))
    leader.controller.on_admitted(mb, Admission.YES)
    leader.acct.decision(LEFT, seq=0)
    for rank in (leader, follower):
        rank.scheduler.waiting_queue.append(_request(5000, "long"))
    events = []
    leader.situation.before_schedule(events)
    leader.situation.wait(timeout_s=60)
    leader.situation.before_schedule(events)
    follower.situation.replay(events[0], rank=1)
    for rank in (leader, follower):
        _form_batch(rank.scheduler, rank.controller)
    inputs = leader.state.controller_inputs(leader.controller)
    return inputs, {0: leader.acct.decisions, 1: follower.acct.decisions}, sum(batch)


def test_check_trace_replays_each_resize_and_reports_a_wrong_size(monkeypatch, tmp_path):
    inputs, decisions, _ = _served_burst(monkeypatch)
    resizes = [r for r in decisions[0] if r["kind"] == RESIZE]
    assert len(resizes) == 2 and [r for r in decisions[1] if r["kind"] == RESIZE] == resizes
    result = CliRunner().invoke(app, ["check", "--trace", _write_trace(tmp_path / "ok", inputs, decisions)])
    assert result.exit_code == 0, result.output
    for rank in (0, 1):  # negative control: an edited size on either rank is a reported difference
        wrong = {r: [dict(d) for d in ds] for r, ds in decisions.items()}
        edited = next(d for d in wrong[rank] if d["kind"] == RESIZE)
        edited["size"] = next(c for c in (256, 512, 1024) if c != edited["size"])
        result = CliRunner().invoke(app, ["check", "--trace", _write_trace(tmp_path / f"bad{rank}", inputs, wrong)])
        assert result.exit_code == 1, result.output
        assert f"rank {rank}" in result.output
        assert f"a size of {resizes[0]['size']} tokens for prompts of [300, 300" in result.output
    tapered = {r: [dict(d) for d in ds] for r, ds in decisions.items()}  # the same size, cut tapered
    next(d for d in tapered[1] if d["kind"] == RESIZE)["tapered"] = True
    result = CliRunner().invoke(app, ["check", "--trace", _write_trace(tmp_path / "tapered", inputs, tapered)])
    assert result.exit_code == 1 and f"size of {resizes[0]['size']} tokens, tapered" in result.output, result.output


def test_check_trace_reports_a_batch_over_the_auto_size(monkeypatch, tmp_path):
    inputs, decisions, tokens = _served_burst(monkeypatch)
    wrong = {r: [dict(d) for d in ds] for r, ds in decisions.items()}
    admit = next(d for d in wrong[0] if d["kind"] == "admit")
    admit["tokens"] = 8 * 300  # the whole burst in one forward: SGLang's cap, not the auto size
    result = CliRunner().invoke(app, ["check", "--trace", _write_trace(tmp_path, inputs, wrong)])
    assert result.exit_code == 1, result.output
    assert f"a prefill forward of at most {tokens} tokens (the auto size)" in result.output


def test_a_trace_without_resize_records_still_replays(monkeypatch, tmp_path):
    inputs, decisions, _ = _served_burst(monkeypatch)
    old = {r: [d for d in ds if d["kind"] not in (RESIZE, CHUNK)] for r, ds in decisions.items()}
    result = CliRunner().invoke(app, ["check", "--trace", _write_trace(tmp_path, inputs, old)])
    assert result.exit_code == 0, result.output


class _NeedsTwoArguments(Exception):
    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} ({code})")


class _AwkwardSizer:
    def choose(self, lengths):
        if lengths == (1,):
            raise _NeedsTwoArguments("cannot plan", 7)
        return lambda: None  # a result that does not pickle


def test_the_planner_child_answers_an_error_that_would_not_load_with_a_stand_in():
    """An exception whose constructor takes other arguments pickles but does not unpickle, and a
    result may not pickle at all: the parent still gets an error naming what happened, in step."""
    import pickle

    from sglang_vpp import plan_wire
    from sglang_vpp.plan_child import _answer

    kind, error, text = pickle.loads(_answer(_AwkwardSizer(), plan_wire.PLAN, (1,)))
    assert kind == plan_wire.ERROR and isinstance(error, RuntimeError)
    assert "_NeedsTwoArguments: cannot plan (7)" in str(error) and "_NeedsTwoArguments" in text
    kind, error, _ = pickle.loads(_answer(_AwkwardSizer(), plan_wire.PLAN, (2,)))
    assert kind == plan_wire.ERROR and "pickle" in str(error).lower()


def test_a_sizer_from_a_multiprocessing_main_is_refused_for_the_planner_process(monkeypatch):
    import pickle

    monkeypatch.setattr(_AwkwardSizer, "__module__", "__mp_main__")
    with pytest.raises(pickle.PicklingError, match="defined in __main__"):
        sizer_bytes(_AwkwardSizer())
