"""``balance_split``: the schedule core picks a layer split for a cost model's tau curve."""

from __future__ import annotations

import pytest

from sglang_vpp.schedule import (LayoutError, RequestSpec, StageCostModel, balance_split, estimated_makespan,
                                 even_split, get_policy)


class PerLayer(StageCostModel):
    """Stage time = (sum of the stage's layer weights) x curve(end of the chunk); free comm."""

    def __init__(self, curve, weights=None):
        self.curve, self.weights = curve, weights

    def stage_cost(self, stage, chunk):
        layers = range(stage.layer_start, stage.layer_end)
        weight = sum(self.weights[l] for l in layers) if self.weights else len(layers)
        return weight * self.curve(chunk.start + chunk.num_tokens)

    def transfer_cost(self, stage, chunk):
        return 0.0


REQUESTS = [RequestSpec(64 * 1024)]


@pytest.mark.parametrize("mode", ["vpp-pack", "cpp"])
def test_uneven_layer_costs_get_a_split_with_a_shorter_estimate(mode):
    # A costly first layer (like dense layers ahead of cheaper MoE ones) unbalances the even split.
    cost = PerLayer(lambda end: 1.0 + end / 65536, weights=[4.0] + [1.0] * 15)
    spec = get_policy(mode)
    num_stages = 4 if mode == "vpp-pack" else 2
    even = even_split(16, num_stages)
    split = balance_split(spec, 2, 16, REQUESTS, 4096, cost)
    assert sum(split) == 16 and min(split) >= 1 and list(split) != even and split[0] < even[0]
    assert (estimated_makespan(spec, 2, 16, REQUESTS, 4096, cost, split)
            < 0.95 * estimated_makespan(spec, 2, 16, REQUESTS, 4096, cost, even))


def test_uniform_cost_keeps_the_even_split():
    cost = PerLayer(lambda end: 1.0)
    assert balance_split(get_policy("vpp-pack"), 2, 8, REQUESTS, 4096, cost) == tuple(even_split(8, 4))


def test_too_few_layers_is_a_user_error():
    with pytest.raises(LayoutError):
        balance_split(get_policy("vpp"), 4, 6, REQUESTS, 4096, PerLayer(lambda end: 1.0))


@pytest.mark.parametrize("mode,layers", [("vpp", 4), ("cpp", 2), ("vpp-pack", 4)])
def test_one_layer_per_stage_is_the_only_split(mode, layers):
    """simulate --balance auto on a 4-layer model at pp 2 printed "min() arg is an empty sequence"."""
    assert balance_split(get_policy(mode), 2, layers, REQUESTS, 4096, PerLayer(lambda end: 1.0)) == (1,) * layers


def test_short_requests_are_scored_on_the_plan_of_a_run_that_batches_them():
    """A run that batches short requests plans them several to a forward; a split scored on the
    one-request-per-forward plan is chosen for work the run never does."""
    spec, short = get_policy("vpp-stream"), [RequestSpec(512)] * 8
    cost = PerLayer(lambda end: 1.0 + end / 4096, weights=[4.0] + [1.0] * 15)
    batched = estimated_makespan(spec, 2, 16, short, 4096, cost, None, batching=True)
    alone = estimated_makespan(spec, 2, 16, short, 4096, cost, None, batching=False)
    assert batched != alone
    # The split chosen for the unbatched plan is no better on the batched one: the even split stays.
    assert balance_split(spec, 2, 16, short, 4096, cost, batching=False) != tuple(even_split(16, 4))
    assert balance_split(spec, 2, 16, short, 4096, cost, batching=True) == tuple(even_split(16, 4))


@pytest.mark.parametrize("batch_requests", [True, False])
def test_simulate_balances_for_the_batching_it_runs_with(monkeypatch, batch_requests):
    from sglang_vpp.sim import sweep
    from sglang_vpp.sim.workloads import short_workload

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("batching"))
        return tuple(even_split(16, 4))

    monkeypatch.setattr(sweep, "balance_split", spy)
    sweep.simulate_matrix(short_workload(4, 512), PerLayer(lambda end: 1.0), 16, "vpp-stream", [4096], 2,
                          balance="auto", batch_requests=batch_requests)
    assert seen == [batch_requests]


def test_a_partial_fill_run_gets_the_split_scored_on_its_own_plan():
    """Batches that start the overflowing request (partial fill) run other forwards than batches of
    whole requests, so the split is scored on the partial-fill plan."""
    spec, short = get_policy("vpp-stream"), [RequestSpec(300)] * 3
    cost = PerLayer(lambda end: 1.0 + end / 4096, weights=[4.0] + [1.0] * 15)
    whole = balance_split(spec, 2, 16, short, 512, cost, batching=True, partial_fill=False)
    filled = balance_split(spec, 2, 16, short, 512, cost, batching=True, partial_fill=True)
    assert whole != filled
    assert (estimated_makespan(spec, 2, 16, short, 512, cost, filled, batching=True, partial_fill=True)
            < estimated_makespan(spec, 2, 16, short, 512, cost, whole, batching=True, partial_fill=True))
