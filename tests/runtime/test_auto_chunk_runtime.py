"""``bench --chunk-size auto``: every rank's planner cuts with the controller's ``auto`` chunker."""

from sglang_vpp.runtime.control import make_planner
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.schedule import RequestSpec, build_layout, get_policy, split_request
from sglang_vpp.schedule.auto_size import AutoChunker, auto_chunker


def test_make_planner_cuts_auto_chunks():
    spec = RunSpec(model="tiny-qwen3", mode="vpp-pack", num_ranks=2, requests=(RequestArrival(6000, 0.0),),
                   chunk_size=4096, auto_chunk=True)
    policy = get_policy("vpp-pack")
    layout = build_layout(2, 8, policy.layout_kind)
    planner = make_planner(spec, layout)
    assert isinstance(planner.controller.chunker, AutoChunker)
    planner.submit(RequestSpec(spec.requests[0].length))
    cut = [c.num_tokens for c in planner.sequence]
    expected = [n for _, n in split_request(auto_chunker(policy, layout, planner.config.cost, 4096), 6000)]
    assert cut == expected and max(cut) <= 4096


def test_runtime_and_simulator_size_a_burst_by_the_same_rule():
    """Requests sent together are sized for together (``auto_size.LiveSituation``) in the
    runtime's replicated planners as in the simulator; sized one by one, the first would be cut
    for itself alone."""
    from sglang_vpp.runtime.control import CoordinatorFeed
    from sglang_vpp.schedule import LinearAttentionCost
    from sglang_vpp.sim.runner import RunConfig, plan_workload
    from sglang_vpp.sim.workloads import Workload

    lengths = [9000, 9000, 9000]
    # A per-forward cost, so more chunks are not free and the situation matters.
    cost = LinearAttentionCost(linear_per_token=2e-6, attention_per_pair=3e-9, fixed_per_chunk=3e-3,
                               transfer_per_token=1e-8)
    spec = RunSpec(model="tiny-qwen3", mode="vpp-pack", num_ranks=2, planner_cost=cost,
                   requests=tuple(RequestArrival(n, 0.0) for n in lengths), chunk_size=4096, auto_chunk=True,
                   partial_fill=False)  # whole requests: no 9000-token prompt joins, so the cuts made at
    # submission are the plan's (a filled batch re-cuts the joining request from its head's end)
    layout = build_layout(2, 8, get_policy("vpp-pack").layout_kind)
    feed = CoordinatorFeed(make_planner(spec, layout), [(n, 0.0) for n in lengths], [], epoch=0.0,
                           clock=lambda: 0.0)
    feed._step()  # the burst is admitted together and cut at submission
    workload = Workload("burst", tuple(RequestSpec(n) for n in lengths), None)
    simulated = plan_workload("vpp-pack", workload, cost,
                              RunConfig(2, 4096, auto_chunk=True, batch_requests=False), 8).schedule
    runtime = [(c.request_index, c.start, c.num_tokens) for c in feed.planner.sequence]
    assert runtime == [(c.request_index, c.start, c.num_tokens) for c in simulated.chunks]
    alone = auto_chunker(get_policy("vpp-pack"), layout, cost, 4096)
    assert [n for _, n in split_request(alone, 9000)] != [n for r, _, n in runtime if r == 0], (
        "the burst must size differently from request 0 alone, or this test checks nothing")


def test_auto_batches_short_prompts_sent_together():
    """``bench --chunk-size auto`` caps the size at ``AUTO_CAP``, not at the prompt, so short
    prompts sent together share forwards where a per-forward cost makes that pay; capped at
    the prompt length it could only run one prompt per forward."""
    from sglang_vpp.runtime.control import CoordinatorFeed
    from sglang_vpp.schedule import LinearAttentionCost
    from sglang_vpp.schedule.auto_size import AUTO_CAP

    lengths = [300] * 8
    cost = LinearAttentionCost(linear_per_token=2e-6, attention_per_pair=3e-9, fixed_per_chunk=3e-3,
                               transfer_per_token=1e-8)
    layout = build_layout(2, 8, get_policy("vpp-pack").layout_kind)

    def forwards(cap: int) -> list[int]:
        spec = RunSpec(model="tiny-qwen3", mode="vpp-pack", num_ranks=2, planner_cost=cost, chunk_size=cap,
                       requests=tuple(RequestArrival(n, 0.0) for n in lengths), auto_chunk=True)
        feed = CoordinatorFeed(make_planner(spec, layout), [(n, 0.0) for n in lengths], [], epoch=0.0,
                               clock=lambda: 0.0)
        feed._step()
        return [(1 + len(c.batch), c.num_tokens + sum(joined.num_tokens for joined in c.batch))
                for c in feed.planner.sequence]

    batched = forwards(AUTO_CAP)
    assert sum(tokens for _, tokens in batched) == sum(lengths) and max(n for n, _ in batched) > 1, batched
    assert max(n for n, _ in forwards(300)) == 1, "capped at the prompt, no forward carries two prompts"
