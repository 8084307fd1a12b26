"""``auto`` stops a candidate's plan once it cannot be chosen (``AutoSizer._plan_candidates``), and picks
exactly as planning every candidate to the end does."""

from __future__ import annotations

import random

import pytest

from sglang_vpp.schedule import (DryRun, LinearAttentionCost, Planner, RequestSpec, build_layout, controller_config,
                                 get_policy)
from sglang_vpp.schedule.auto_size import AutoSizer, PlanScore, ScoredRun, auto_chunker
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.runner import RunConfig, run_mode
from sglang_vpp.sim.workloads import mixed_workload

MODEL = load_model("deepseek-v3.1")
NPU = AnalyticCostModel(MODEL, load_hardware("ascend-910c"))


def _never_stop(monkeypatch) -> None:
    monkeypatch.setattr(AutoSizer, "_stop", staticmethod(lambda results: None))


def _planner(mode: str = "vpp-stream", ranks: int = 2, chunk: int = 2048) -> Planner:
    spec = get_policy(mode)
    layout = build_layout(ranks, 8, spec.layout_kind)
    cost = LinearAttentionCost(fixed_per_chunk=0.5)
    return Planner(controller_config(spec, layout, chunk, cost, 1 << 20, batching=True), sees_transfers=True)


def test_a_run_stopped_and_gone_on_with_ends_as_one_never_stopped():
    whole, stepped = _planner(), _planner()
    for planner in (whole, stepped):
        for length in (9_000, 3_000, 5_000):
            planner.submit(RequestSpec(length))
    DryRun(whole).run()
    run = DryRun(stepped)
    run.run(until=1.0)
    assert len(stepped.request_finish) < 3
    for until in (2.5, 2.5, 4.0):
        run.go_on(until)
    run.go_on()
    assert stepped.request_finish == whole.request_finish
    assert [list(stepped.rank_actions(r)) for r in range(2)] == [list(whole.rank_actions(r)) for r in range(2)]


def test_a_stopped_score_bounds_the_full_one_from_below_and_goes_on_to_it():
    def scored() -> tuple[ScoredRun, Planner]:
        planner = _planner()
        for length in (9_000, 3_000, 5_000):
            planner.submit(RequestSpec(length))
        finish = planner.request_finish
        return ScoredRun(planner, 0.0, lambda: [*finish, *(i for i in range(3) if i not in finish)]), planner

    full = scored()[0].through(None)
    assert full.exact
    run, planner = scored()
    stop = full.makespan / 2
    bound = run.through(stop)
    assert not bound.exact
    assert stop <= bound.makespan <= full.makespan
    assert bound.completion <= full.completion
    # The bound counts what finished at its end and the stop for the rest.
    ends = list(planner.request_finish.values())
    assert bound.completion == (sum(ends) + stop * (3 - len(ends))) / 3
    assert run.to_end() == full
    # A stop past the end is no stop.
    assert scored()[0].through(full.makespan * 2) == full


@pytest.mark.parametrize("mode,ranks,lengths", [
    ("vpp-stream", 4, [65_536]),
    ("vpp-stream", 8, [262_144, 8_192, 8_192]),
    ("vpp-pack", 2, [4_096] * 24),
    ("cpp", 4, [16_384] * 12 + [131_072]),
    ("dcpp", 2, [100_000, 30_000]),
])
def test_stopped_plans_pick_what_plans_run_to_the_end_pick(monkeypatch, mode, ranks, lengths):
    spec = get_policy(mode)
    layout = build_layout(ranks, MODEL.num_layers, spec.layout_kind)
    stopping = auto_chunker(spec, layout, NPU).sizer.choose(lengths)
    _never_stop(monkeypatch)
    full = auto_chunker(spec, layout, NPU).sizer.choose(lengths)
    assert (stopping.chunk_size, stopping.tapered) == (full.chunk_size, full.tapered)
    assert stopping.stopped, "no plan stopped: the case tests nothing"
    if mode == "vpp-stream":  # the tapered cuts' plans stop too, and are checked with the fixed ones
        assert any(tapered for _, tapered in stopping.stopped)
    assert full.stopped == ()
    for kind, rows, full_rows in (("fixed", stopping.scores, full.scores),
                                  ("tapered", stopping.taper_scores, full.taper_scores)):
        assert [r[0] for r in rows] == [r[0] for r in full_rows]
        for (size, makespan, completion), (_, full_makespan, full_completion) in zip(rows, full_rows):
            if (size, kind == "tapered") in stopping.stopped:
                assert makespan <= full_makespan and completion <= full_completion
            else:
                assert (makespan, completion) == (full_makespan, full_completion)


@pytest.mark.parametrize("mode,ranks", [("vpp-stream", 4), ("cpp", 2), ("vpp-pack", 2), ("dcpp", 4)])
def test_a_live_auto_run_is_the_same_with_plans_stopped(monkeypatch, mode, ranks):
    """A simulated closed loop with ``auto`` (every send sized from the running planner): the
    same sizes, cuts and times whether losing plans stop or run to the end."""
    work = mixed_workload(num_requests=8, seed=3, concurrency=4)

    config = RunConfig(ranks, 65_536, auto_chunk=True, sim=SimConfig(record_timeline=False))
    bounds = []
    through = ScoredRun.through

    def counted(run: ScoredRun, stop: float | None):
        score = through(run, stop)
        bounds.append(not score.exact)
        return score

    monkeypatch.setattr(ScoredRun, "through", counted)

    def run():
        result = run_mode(mode, work, NPU, config, MODEL.num_layers)
        return result.auto_sizes, result.auto_tapered, result.sim.makespan_s, result.sim.request_ttft_s

    stopping = run()
    assert any(bounds), "no plan stopped: the case tests nothing"
    _never_stop(monkeypatch)
    assert run() == stopping


class _Known:
    """A candidate's plan whose makespan and mean completion are known: stopped before its end, it
    reports the stop and ``bound_share`` of its mean completion (both lower bounds, as a dry
    run's are)."""

    def __init__(self, makespan: float, completion: float, bound_share: float) -> None:
        self.makespan, self.completion, self.bound_share = makespan, completion, bound_share

    def through(self, stop: float | None) -> PlanScore:
        if stop is None or self.makespan <= stop:
            return PlanScore(self.makespan, self.completion)
        return PlanScore(stop, self.completion * self.bound_share, exact=False)

    def to_end(self) -> PlanScore:
        return self.through(None)


def _pick_stopping(plans: dict[int, tuple[float, float, float]]) -> tuple[int, bool]:
    sizer = auto_chunker(get_policy("cpp"), build_layout(2, 8, get_policy("cpp").layout_kind), LinearAttentionCost()).sizer
    results, stopped = {}, {}
    sizer._plan_candidates([(size, False) for size in plans], lambda cut, size: _Known(*plans[size]), results, stopped)
    return AutoSizer._pick([(key, s.makespan, s.completion) for key, s in results.items()])


def _pick_all(plans: dict[int, tuple[float, float, float]]) -> tuple[int, bool]:
    return AutoSizer._pick([((size, False), m, t) for size, (m, t, _) in plans.items()])


def test_a_stopped_plan_that_a_later_plan_no_longer_beats_runs_on():
    """Planned largest first: 16, 8 and 4 end within the bar; 2 stops just past 4's makespan
    plus the best loss (4's, 7 %), beaten (mean completion bound 5.80 above 16's 5.67). 1's
    bound of 5.09 is not above it, so 1 runs on to its 5.25, which raises every loss: the best
    is now 1's 10.7 %, and 2's bounds (7 %) no longer show that it loses. Run on, 2 loses
    after all (87 %), and 1 is the pick, as when every plan runs to the end."""
    plans = {1: (11.37, 5.25, 0.97), 2: (11.53, 9.83, 0.59), 4: (10.27, 6.07, 0.62),
             8: (11.49, 6.84, 0.77), 16: (11.58, 5.67, 0.80)}
    assert _pick_all(plans) == (1, False)
    assert _pick_stopping(plans) == (1, False)


def test_stopped_plans_pick_as_all_plans_on_random_cases():
    rnd = random.Random(0)
    for _ in range(2000):
        plans = {1 << k: (rnd.uniform(10, 12), rnd.uniform(5, 12), rnd.uniform(0.5, 1.0))
                 for k in range(rnd.randint(2, 6))}
        assert _pick_stopping(plans) == _pick_all(plans), plans
