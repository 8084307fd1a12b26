"""An external planner (no clock of its own, completions reported by its executor) decides as
the estimated planner does on the same durations, and follows the reported times when they
depart from its estimate."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest

from sglang_vpp.schedule import LinearAttentionCost, Planner, RequestSpec, controller_config
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


def _estimated(mode, num_ranks, batching, durations):
    planner = Planner(_config(mode, num_ranks, batching), durations=durations)
    for request in _requests():
        planner.submit(request)
    planner.advance()
    return planner


def _driven(mode, num_ranks, batching, durations, instants=None):
    """An external planner fed by a small executor: each rank runs its actions in order, a
    compute takes ``durations``' time, a hand-off none; reports due at one time are given
    together, then the planner decides at that time. ``instants``: stop once that many
    instants have passed (work still in flight)."""
    config = _config(mode, num_ranks, batching)
    planner = Planner(config, external=True)
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
def test_reported_estimates_give_the_estimated_plan(mode, num_ranks, batching):
    estimated = _estimated(mode, num_ranks, batching, ESTIMATE)
    driven = _driven(mode, num_ranks, batching, ESTIMATE)
    assert _streams(driven) == _streams(estimated)
    assert driven.request_finish == pytest.approx(estimated.request_finish)


@pytest.mark.parametrize("mode", MODES)
def test_decisions_follow_the_reported_times(mode):
    """Rank 1 three times slower than estimated: the external planner decides on the reported
    times, as the estimated planner does when it is given those durations."""
    slow = SlowRank(ESTIMATE, 1, 3.0)
    driven = _driven(mode, 2, True, slow)
    assert _streams(driven) == _streams(_estimated(mode, 2, True, slow))
    assert driven.request_finish == pytest.approx(_estimated(mode, 2, True, slow).request_finish)


def test_a_slow_rank_changes_the_fold_back_order():
    """The reported times change which ready stage rank 0 runs first (not only when)."""
    fast = _streams(_driven("vpp-stream", 2, False, ESTIMATE))[0]
    slow = _streams(_driven("vpp-stream", 2, False, SlowRank(ESTIMATE, 1, 3.0)))[0]
    computes = lambda stream: [a for a in stream if "SEND" not in a and "RECV" not in a]  # noqa: E731
    assert sorted(computes(fast)) == sorted(computes(slow))
    assert computes(fast) != computes(slow)


def test_reports_must_follow_emitted_actions():
    planner = Planner(_config("vpp-async", 2, False), external=True)
    with pytest.raises(ValueError, match="only 0 were emitted"):
        planner.action_done(0, 0.0)
    with pytest.raises(ValueError, match="pass until"):
        planner.advance()
    estimated = Planner(_config("vpp-async", 2, False))
    with pytest.raises(ValueError, match="estimated clock"):
        estimated.action_done(0, 0.0)
    with pytest.raises(ValueError, match="durations"):
        Planner(_config("vpp-async", 2, False), durations=ESTIMATE, external=True)


@pytest.mark.parametrize("mode", ["vpp", "vpp-stream", "vpp-pack", "cpp"])
@pytest.mark.parametrize("num_ranks", [2, 3])
@pytest.mark.parametrize("instants", [3, 7])
def test_a_fork_of_an_external_planner_plans_on_as_the_estimated_clock_would(mode, num_ranks, instants):
    """Mid-run, with work in flight on several ranks, a fork of the external planner (its
    in-flight work ends at its estimated ends) plans the rest, and a request sent now, exactly
    as a fork of the planner on its own clock at the same moment does; neither fork touches
    its original."""
    driven = _driven(mode, num_ranks, True, ESTIMATE, instants=instants)
    assert not driven.settled
    clocked = Planner(_config(mode, num_ranks, True))
    for request in driven.requests:
        clocked.submit(RequestSpec(request.length, request.arrival))
    clocked.advance(until=driven.now)
    assert _streams(clocked) == _streams(driven)
    before = (_streams(driven), dict(driven.request_finish), list(driven._reported), driven.now)
    twins = [planner.fork(planner.config.chunker, None) for planner in (driven, clocked)]
    for twin in twins:
        twin.submit(RequestSpec(2000, driven.now))
        twin.advance()
    assert len(twins[0].request_finish) == len(driven.requests) + 1
    assert twins[0].request_finish == pytest.approx(twins[1].request_finish, rel=1e-12)
    assert not twins[0].external and driven.external
    assert (_streams(driven), dict(driven.request_finish), list(driven._reported), driven.now) == before
