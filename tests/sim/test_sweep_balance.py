"""``simulate_matrix --balance auto``: the split is chosen for the plan the run makes."""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import RequestSpec
from sglang_vpp.sim import sweep
from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.workloads import Workload


@pytest.mark.parametrize("partial_fill", [False, True])
def test_balance_auto_scores_splits_with_the_runs_batching_and_partial_fill(monkeypatch, partial_fill):
    seen = []
    real = sweep.balance_split

    def recording(*args, **kwargs):
        seen.append((kwargs.get("batching"), kwargs.get("partial_fill")))
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "balance_split", recording)
    model = load_model("qwen3-coder-30b-a3b")
    cost = AnalyticCostModel(model, load_hardware("ascend-910c"))
    work = Workload("short", [RequestSpec(3000)] * 4)
    rows = sweep.simulate_matrix(work, cost, model.num_layers, "vpp-stream", [4096], 2, balance="auto",
                                 partial_fill=partial_fill, sim=SimConfig(record_timeline=False))
    assert rows[0].result.sim.ok
    assert seen == [(True, partial_fill)]


def test_partial_fill_without_batching_is_refused_before_the_split_search(monkeypatch):
    from sglang_vpp.sim.errors import SimError

    monkeypatch.setattr(sweep, "balance_split", lambda *a, **k: pytest.fail("searched a refused run's split"))
    model = load_model("qwen3-coder-30b-a3b")
    cost = AnalyticCostModel(model, load_hardware("ascend-910c"))
    with pytest.raises(SimError, match="--partial-fill needs --batch-requests"):
        sweep.simulate_matrix(Workload("short", [RequestSpec(3000)] * 4), cost, model.num_layers, "vpp-stream",
                              [4096], 2, balance="auto", batch_requests=False, partial_fill=True)
