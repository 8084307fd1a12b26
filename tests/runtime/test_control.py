"""The control plane without processes: replicated online planners agree with each other and with
the offline ``build_schedule``; late arrivals are appended without disturbing what is planned."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from sglang_vpp.runtime.control import (
    Advance,
    CoordinatorFeed,
    Done,
    FollowerFeed,
    StaticFeed,
    Submit,
    make_planner,
)
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.schedule import (
    RequestSpec,
    build_layout,
    build_schedule,
    get_policy,
    validate_schedule,
)

MODES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]


def _drain(feed) -> list[str]:
    out = []
    while True:
        action = feed.next_action(lambda: None)
        if action is None:
            return out
        out.append(str(action))


def _spec(mode: str, ranks: int, lengths: list[int], chunk: int, arrivals: list[float] | None = None) -> RunSpec:
    arrivals = arrivals or [0.0] * len(lengths)
    return RunSpec("tiny-qwen3", mode, ranks, tuple(RequestArrival(n, a) for n, a in zip(lengths, arrivals)), chunk)


def _feeds(spec: RunSpec, epoch: float = 0.0, clock=time.perf_counter):
    layout = build_layout(spec.num_ranks, 8, get_policy(spec.mode).layout_kind)
    queues = [queue.Queue() for _ in range(spec.num_ranks)]  # queues[0]: the followers' reports
    coordinator = CoordinatorFeed(make_planner(spec, layout), [(r.length, r.arrival_s) for r in spec.requests],
                                  queues[1:], epoch=epoch, reports=queues[0], clock=clock)
    followers = [FollowerFeed(r, make_planner(spec, layout), queues[r], timeout_s=5.0, reports=queues[0])
                 for r in range(1, spec.num_ranks)]
    return layout, coordinator, followers


def _execute(coordinator, followers, action_s: float = 0.0) -> list[list[str]]:
    """Every rank in a thread, as the executor does: take, "run" (sleep), report."""
    streams: list[list[str]] = [[] for _ in range(1 + len(followers))]
    errors: list[BaseException] = []

    def rank_loop(feed) -> None:
        try:
            while (action := feed.next_action(lambda: None)) is not None:
                time.sleep(action_s)
                streams[feed.rank].append(str(action))
                feed.done(time.perf_counter() - coordinator._epoch)
        except BaseException as error:
            errors.append(error)

    coordinator.start()
    threads = [threading.Thread(target=rank_loop, args=(f,), daemon=True) for f in [coordinator, *followers]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30.0)
    coordinator.close()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return streams


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ranks", [2, 4])
def test_replicas_execute_the_same_valid_streams(mode, ranks):
    spec = _spec(mode, ranks, [300, 130, 64], 48)
    layout, coordinator, followers = _feeds(spec, epoch=time.perf_counter())
    streams = _execute(coordinator, followers)
    for feed in [coordinator, *followers]:
        assert streams == [[str(a) for a in feed.planner.rank_actions(r)] for r in range(ranks)]
        assert feed.planner.settled
    assert coordinator.ended and all(f.ended for f in followers)
    from sglang_vpp.runtime.records import RankReport
    from sglang_vpp.runtime.replay import executed_schedule

    reports = [RankReport(0, 0, executed=streams[0], lengths=[300, 130, 64], arrivals_s=[0.0] * 3,
                          chunks=[(c.request_index, c.chunk_index, c.start, c.num_tokens, c.is_last, c.batch)
                                  for c in coordinator.planner.sequence])]
    reports += [RankReport(r, 0, executed=streams[r]) for r in range(1, ranks)]
    validate_schedule(executed_schedule(spec, layout, reports))


@pytest.mark.parametrize("mode", MODES)
def test_late_arrival_is_planned_consistently(mode):
    """Request 1 arrives while request 0 runs: every replica sees the same ops and request 1 is
    admitted at its real arrival."""
    spec = _spec(mode, 2, [400, 100], 50, arrivals=[0.0, 0.05])
    _, coordinator, (follower,) = _feeds(spec, epoch=time.perf_counter())
    streams = _execute(coordinator, [follower], action_s=0.01)
    assert coordinator.arrivals_s == follower.arrivals_s == [0.0, 0.05]
    assert streams[1] == [str(a) for a in follower.planner.rank_actions(1)]
    assert follower.planner.requests[1].arrival > 0.0  # submitted when it arrived, not up front


def test_rank0_waits_for_the_followers_report():
    """vpp folds the last stage back onto rank 0: rank 0 gets its last-stage compute only once
    rank 1 has reported its stage, at the reported time (no plan ahead on the estimate)."""
    spec = _spec("vpp", 2, [100], 100)
    now = [0.0]
    layout, coordinator, (follower,) = _feeds(spec, clock=lambda: now[0])
    last = layout.last_stage
    assert layout.rank_of(last) == 0

    def rank0_runs_what_it_has() -> list:
        coordinator._step()
        taken = []
        while coordinator.upcoming():
            taken.append(coordinator.next_action(lambda: None))
            coordinator.done(0.001)
            coordinator._step()
        return taken

    taken = rank0_runs_what_it_has()
    assert taken and all(a.stage_index != last for a in taken)
    assert not any(a.stage_index == last for a in rank0_runs_what_it_has())  # nothing without rank 1
    for _ in range(20):  # rank 1 runs everything it gets; it finishes much later than any estimate
        while not follower._queue.empty():
            follower.apply(follower._queue.get())
        while follower.queue:
            follower.next_action(lambda: None)
            now[0] = 7.0
            follower.done(7.0)
        taken += rank0_runs_what_it_has()
    assert any(a.stage_index == last for a in taken)
    assert coordinator.planner.now >= 7.0
    assert min(e.start for e in coordinator.planner.timeline if e.stage_index == last) >= 7.0


def test_end_only_when_everything_is_reported():
    spec = _spec("cpp", 1, [64], 64)
    layout = build_layout(1, 8, "contiguous")
    coordinator = CoordinatorFeed(make_planner(spec, layout), [(64, 0.0)], [], epoch=0.0, clock=lambda: 0.0)
    action = coordinator.next_action(lambda: None)
    assert action is not None
    coordinator._step()
    assert not coordinator.ended  # the compute is in flight until reported
    coordinator.done(0.5)
    assert coordinator.next_action(lambda: None) is None and coordinator.ended


def _broken_coordinator():
    """A started coordinator whose planner fails at its first decision."""
    _, coordinator, _ = _feeds(_spec("cpp", 2, [64], 64), epoch=time.perf_counter())

    def broken(until=None):
        raise ValueError("planner exploded")

    coordinator.planner.advance = broken
    coordinator.start()
    return coordinator


def test_control_thread_error_surfaces_in_the_main_thread():
    coordinator = _broken_coordinator()
    with pytest.raises(RuntimeError, match="control thread failed") as info:
        coordinator.next_action(lambda: None)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="control thread failed"):
        coordinator.close()  # closing surfaces it too, unless another error is on its way up
    assert not coordinator._thread.is_alive()


def test_control_thread_error_reaches_an_executor_waiting_on_comm():
    """The executor's waits call ``feed.check`` (through ``_check_abort``): a control-thread
    failure stops rank 0 at once with its own cause, not a comm timeout later."""
    from sglang_vpp.runtime.executor import RankExecutor

    coordinator = _broken_coordinator()
    deadline = time.monotonic() + 5.0
    while coordinator._error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = RankExecutor.__new__(RankExecutor)  # only what _check_abort reads
    waiting.feed, waiting._aborted, waiting.rank, waiting.records = coordinator, (lambda: False), 0, []
    with pytest.raises(RuntimeError, match="control thread failed") as info:
        waiting._check_abort()
    assert isinstance(info.value.__cause__, ValueError)
    coordinator._stop.set()


def _handle_finishing_as_a_slice_ends(result, error):
    """A real ``OpHandle`` whose channel thread completes it just after a timed wait gave up."""
    from types import SimpleNamespace

    from sglang_vpp.comm.base import OpKind
    from sglang_vpp.comm.channel import OpHandle

    channel = SimpleNamespace(group="fwd", peer=0, rank=1, notify=lambda: None,
                              link=SimpleNamespace(deliver=lambda tensors: tensors),
                              describe_pending=lambda handle: "the operation finished while the wait gave up")
    handle = OpHandle(OpKind.RECV, "1RECV_F0.0<0@fwd", channel, default_timeout_s=60.0)
    event_wait = handle._event.wait

    def wait(timeout=None):
        ready = event_wait(0)
        if not ready:
            handle._complete(result, error)  # the channel thread, right after the slice ended
        return ready

    handle._event.wait = wait
    return handle


def _waiting_executor():
    from types import SimpleNamespace

    from sglang_vpp.runtime.executor import RankExecutor
    from sglang_vpp.runtime.spec import Timeouts

    waiting = RankExecutor.__new__(RankExecutor)  # only what _wait reads
    waiting.feed, waiting._aborted = SimpleNamespace(check=lambda: None), (lambda: False)
    waiting.rank, waiting.records = 1, []
    waiting.timeouts = Timeouts(comm_s=5.0)
    return waiting


def test_executor_wait_returns_an_operation_that_completes_as_a_wait_slice_ends():
    """A receive delivered between the end of a 0.5 s wait slice and the executor's look at the
    handle is a success, not a timeout of the slice."""
    handle = _handle_finishing_as_a_slice_ends({"hidden": 7}, None)
    assert _waiting_executor()._wait(handle, str(handle.action)) == {"hidden": 7}


def test_executor_wait_raises_the_operations_own_error_when_it_fails_as_a_wait_slice_ends():
    from sglang_vpp.comm.errors import PeerDeadError

    dead = PeerDeadError(rank=1, peer=0, group="fwd", action="1RECV_F0.0<0@fwd", detail="the peer died")
    handle = _handle_finishing_as_a_slice_ends(None, dead)
    with pytest.raises(PeerDeadError) as info:
        _waiting_executor()._wait(handle, str(handle.action))
    assert info.value is dead


def test_executor_wait_reports_an_operations_own_timeout_as_is():
    from sglang_vpp.comm.errors import CommTimeoutError

    expired = CommTimeoutError(rank=1, peer=0, group="fwd", action="1RECV_F0.0<0@fwd", timeout_s=90.0,
                               detail="the transport gave up waiting")
    handle = _handle_finishing_as_a_slice_ends(None, expired)
    handle._complete(None, expired)
    with pytest.raises(CommTimeoutError) as info:
        _waiting_executor()._wait(handle, str(handle.action))
    assert info.value is expired


def test_abort_stops_the_control_thread():
    spec = _spec("cpp", 2, [64], 64, arrivals=[60.0])
    _, coordinator, _ = _feeds(spec, epoch=time.perf_counter())
    coordinator.start()

    def abort():
        raise RuntimeError("aborted")

    with pytest.raises(RuntimeError, match="aborted"):
        coordinator.next_action(abort)
    coordinator._thread.join(timeout=2.0)
    assert not coordinator._thread.is_alive()




def test_follower_times_out_without_ops():
    spec = _spec("cpp", 2, [100], 50)
    layout = build_layout(2, 8, "contiguous")
    follower = FollowerFeed(1, make_planner(spec, layout), queue.Queue(), timeout_s=0.3)
    with pytest.raises(TimeoutError, match="no planning op from rank 0"):
        follower.next_action(lambda: None)


def test_ops_are_plain_data():
    assert Submit(10, 0.0, 1.5) == Submit(10, 0.0, 1.5)
    assert Advance(2.0).until == 2.0
    assert Done(1, 0.5) == Done(1, 0.5)


def test_static_feed_replays_a_schedule():
    plan = build_schedule("vpp", 2, 8, [RequestSpec(100)], 40)
    feed = StaticFeed(1, plan)
    assert _drain(feed) == [str(a) for a in plan.rank_actions[1]]


def test_profiled_planner_cost_drives_dcpp():
    """The start-up profile sees attention grow with the prefix, so dcpp shrinks later chunks
    (with the generic estimate it would not know the model)."""
    from sglang_vpp.runtime.models import resolve_model
    from sglang_vpp.runtime.profile import profiled_cost_model

    cost = profiled_cost_model(resolve_model("tiny-qwen3"), 512, 8192)
    assert cost.per_layer is not None and cost.per_layer.a > 0
    plan = build_schedule("dcpp", 2, 8, [RequestSpec(8192)], 512, cost=cost)
    sizes = [c.num_tokens for c in plan.chunks]
    assert sizes[0] == 512 and sizes[-2] < 512 and len(sizes) > 8192 // 512


def test_the_runtime_and_the_plugin_share_one_heartbeat_period():
    """Rank 0's control thread and the SGLang plugin's leader loop keep an idle follower alive for
    the same reason: one period, read from one module, so the two cannot drift apart."""
    from sglang_vpp import heartbeat
    from sglang_vpp.runtime import control
    from sglang_vpp.sglang_plugin.vpp import state

    assert control.DEFAULT_HEARTBEAT_S is heartbeat.DEFAULT_HEARTBEAT_S
    assert state.DEFAULT_HEARTBEAT_S is heartbeat.DEFAULT_HEARTBEAT_S
    assert state.VppConfig("vpp", 2).heartbeat_s == heartbeat.DEFAULT_HEARTBEAT_S
