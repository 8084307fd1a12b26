"""The planner (no clock of its own, completions reported by its executor) decides the same
when two different executors report the same durations: a small one below that sees no wire,
and the engine's dry run (``schedule.dry_run``); it follows the reported times when they depart
from its estimate, and a fork of it mid-run plans on as a fork of the dry run does."""

from __future__ import annotations

import heapq
import inspect
from dataclasses import dataclass

import pytest

from sglang_vpp.schedule import DryRun, LinearAttentionCost, Planner, RequestSpec, controller_config, dry_run
from sglang_vpp.schedule.cost import StageCostModel
from sglang_vpp.schedule.factory import policy_layout
from sglang_vpp.schedule.ir import ActionKind
from sglang_vpp.schedule.policies import get_policy

MODES = ("cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-taper", "vpp-stream")
ESTIMATE = LinearAttentionCost(fixed_per_chunk=2e-4)


@dataclass(frozen=True)
class SlowRank(StageCostModel):
    """``base``'s durations, ``factor`` times longer on ``rank``'s stages (no hand-off time)."""

    base: StageCostModel
    rank: int
    factor: float

    def stage_cost(self, stage, chunk):
        cost = self.base.stage_cost(stage, chunk)
        return cost * self.factor if stage.rank == self.rank else cost


def _config(mode: str, num_ranks: int, batching: bool):
    layout = policy_layout(get_policy(mode), num_ranks, 4 * num_ranks, None, "split")
    return controller_config(mode, layout, 1024, ESTIMATE, 8192, batching=batching)


def _requests():
    return [RequestSpec(5000, 0.0), RequestSpec(600, 0.0), RequestSpec(3000, 0.004), RequestSpec(700, 0.02),
            RequestSpec(2500, 0.02)]


def _dry_run(mode, num_ranks, batching, durations, until=None):
    planner = Planner(_config(mode, num_ranks, batching), sees_transfers=True)
    for request in _requests():
        planner.submit(request)
    DryRun(planner, durations).run(until)
    return planner


def _driven(mode, num_ranks, batching, durations, instants=None):
    """A planner fed by a small executor: each rank runs its actions in order, a compute takes
    ``durations``' time, a hand-off none; reports due at one time are given together, then the
    planner decides at that time. ``instants``: stop once that many instants have passed (work
    still in flight)."""
    config = _config(mode, num_ranks, batching)
    planner = Planner(config)
    pending = list(_requests())
    stages = config.layout.stages
    chunks = {}
    heap: list[tuple[float, int, int]] = []
    free = [0.0] * num_ranks
    count = 0
    now = 0.0
    while True:
        while pending and pending[0].arrival <= now:
            planner.submit(pending.pop(0))
        planner.advance(until=now)
        chunks.update({c.key: c for c in planner.sequence})
        for rank in range(num_ranks):
            for action in planner.take_new_actions(rank):
                end = max(free[rank], now)
                if action.kind is ActionKind.COMPUTE:
                    end += durations.stage_cost(stages[action.stage_index], chunks[action.chunk_key])
                free[rank] = end
                heapq.heappush(heap, (end, count, rank))
                count += 1
        upcoming = [heap[0][0]] if heap else []
        upcoming += [pending[0].arrival] if pending else []
        if not upcoming:
            break
        if instants is not None and min(upcoming) > now:
            if instants == 0:
                return planner
            instants -= 1
        now = min(upcoming)
        while heap and heap[0][0] == now:
            _, _, rank = heapq.heappop(heap)
            planner.action_done(rank, now)
    assert planner.settled
    return planner


def _streams(planner):
    return [[str(a) for a in planner.rank_actions(r)] for r in range(planner.config.layout.num_ranks)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_ranks", [2, 3])
@pytest.mark.parametrize("batching", [False, True])
def test_reported_estimates_give_the_dry_run(mode, num_ranks, batching):
    planned = _dry_run(mode, num_ranks, batching, ESTIMATE)
    driven = _driven(mode, num_ranks, batching, ESTIMATE)
    assert _streams(driven) == _streams(planned)
    assert driven.request_finish == pytest.approx(planned.request_finish)
    assert len(driven.request_finish) == len(_requests())


@pytest.mark.parametrize("mode", MODES)
def test_decisions_follow_the_reported_times(mode):
    """Rank 1 three times slower than estimated: the planner decides on the reported times, as
    the dry run given those durations does (the controller still deciding with its estimate)."""
    slow = SlowRank(ESTIMATE, 1, 3.0)
    driven = _driven(mode, 2, True, slow)
    planned = _dry_run(mode, 2, True, slow)
    assert _streams(driven) == _streams(planned)
    assert driven.request_finish == pytest.approx(planned.request_finish)
    assert driven.request_finish != pytest.approx(_dry_run(mode, 2, True, ESTIMATE).request_finish)


def test_a_slow_rank_changes_the_fold_back_order():
    """The reported times change which ready stage rank 0 runs first (not only when)."""
    fast = _streams(_driven("vpp-stream", 2, False, ESTIMATE))[0]
    slow = _streams(_driven("vpp-stream", 2, False, SlowRank(ESTIMATE, 1, 3.0)))[0]
    computes = lambda stream: [a for a in stream if "SEND" not in a and "RECV" not in a]  # noqa: E731
    assert sorted(computes(fast)) == sorted(computes(slow))
    assert computes(fast) != computes(slow)


def test_reports_must_follow_emitted_actions():
    planner = Planner(_config("vpp-async", 2, False))
    with pytest.raises(ValueError, match="only 0 were emitted"):
        planner.action_done(0, 0.0)
    with pytest.raises(ValueError, match="sees_transfers"):
        planner.transfer_done(0, (0, 0), 0.0)
    with pytest.raises(ValueError, match="sees transfers"):
        dry_run(planner)


@pytest.mark.parametrize("mode", ["vpp", "vpp-stream", "vpp-pack", "cpp"])
@pytest.mark.parametrize("num_ranks", [2, 3])
@pytest.mark.parametrize("instants", [3, 7])
def test_a_fork_mid_run_plans_on_as_a_fork_of_the_dry_run(mode, num_ranks, instants):
    """Mid-run, with work in flight on several ranks, a fork of the driven planner (its in-flight
    work ends at its estimated ends, hand-offs on their way are carried) plans the rest, and a
    request sent now, exactly as a fork of the dry run stopped at the same moment does, and as
    the dry run itself goes on; neither fork touches its original."""
    driven = _driven(mode, num_ranks, True, ESTIMATE, instants=instants)
    assert not driven.settled
    planned = Planner(_config(mode, num_ranks, True), sees_transfers=True)
    for request in driven.requests:
        planned.submit(RequestSpec(request.length, request.arrival))
    run = DryRun(planned)
    run.run(until=driven.now)
    assert _streams(planned) == _streams(driven)
    before = (_streams(driven), dict(driven.request_finish), list(driven._reported), driven.now)
    twins = [planner.fork(planner.config.chunker, planner.config.token_budget) for planner in (driven, planned)]
    for twin in twins:
        twin.submit(RequestSpec(2000, driven.now))
        dry_run(twin)
    assert len(twins[0].request_finish) == len(driven.requests) + 1
    assert twins[0].request_finish == pytest.approx(twins[1].request_finish, rel=1e-12)
    assert (_streams(driven), dict(driven.request_finish), list(driven._reported), driven.now) == before
    planned.submit(RequestSpec(2000, driven.now))
    run.run()
    assert planned.request_finish == pytest.approx(twins[1].request_finish, rel=1e-12)


def test_the_planner_has_no_clock_of_its_own():
    """Advanced to any time, a planner finishes nothing its executor has not reported: it emits
    the first actions and waits; only reports (here the dry run's engine) move work on."""
    planner = Planner(_config("vpp-stream", 2, True), sees_transfers=True)
    for request in _requests():
        planner.submit(request)
    planner.advance(until=1e9)
    emitted = [len(planner.rank_actions(rank)) for rank in range(2)]
    assert emitted[0] > 0 and not planner.request_finish and not planner.settled
    planner.advance(until=2e9)
    assert [len(planner.rank_actions(rank)) for rank in range(2)] == emitted
    assert "durations" not in inspect.signature(Planner).parameters


SLOW_LINKS = LinearAttentionCost(fixed_per_chunk=2e-4, transfer_per_token=1e-4)
"""Hand-offs about as long as computes: transfers queue on their link."""


@pytest.mark.parametrize("mode", ["cpp", "vpp", "vpp-async", "vpp-stream"])
@pytest.mark.parametrize("num_ranks", [2, 4])
@pytest.mark.parametrize("share", [0.15, 0.45])
def test_a_fork_on_slow_links_plans_on_exactly_as_the_dry_run_goes_on(mode, num_ranks, share):
    """Forked mid-run with hand-offs on the wire and links busy, the fork's dry run (the in-flight
    hand-offs carried into its engine, each timed behind its link's last reported transfer)
    finishes every request when the dry run itself, going on with the same request, does."""
    def planner():
        layout = policy_layout(get_policy(mode), num_ranks, 4 * num_ranks, None, "split")
        planned = Planner(controller_config(mode, layout, 1024, SLOW_LINKS, 8192, batching=True), sees_transfers=True)
        for request in _requests():
            planned.submit(request)
        return planned

    whole = planner()
    dry_run(whole)
    planned = planner()
    run = DryRun(planned)
    run.run(until=share * max(whole.request_finish.values()))
    twin = planned.fork(planned.config.chunker, planned.config.token_budget)
    twin.submit(RequestSpec(2000, planned.now))
    dry_run(twin)
    planned.submit(RequestSpec(2000, planned.now))
    run.run()
    assert twin.request_finish == pytest.approx(planned.request_finish, rel=1e-12, abs=1e-15)


def test_a_dry_run_that_cannot_go_on_names_the_planner_state():
    """A controller that never admits its work: the dry run stops with the planner's state, not
    a deadlock report, even where deadlocking streams are allowed (the checker's negative control
    is the only stall a dry run returns)."""
    from sglang_vpp.schedule.controller import Admission
    from sglang_vpp.schedule.errors import ScheduleError

    for allow in (False, True):
        planner = Planner(_config("vpp-pack", 2, False), sees_transfers=True)
        planner.controller.admission = lambda mb: Admission.NO
        planner.submit(RequestSpec(3000))
        with pytest.raises(ScheduleError, match="no rank can go on.*next positions"):
            dry_run(planner, allow_deadlock=allow)
