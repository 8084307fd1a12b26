"""Short requests batched into one forward up to the token budget (``Controller.joining_tokens``),
whole or, with ``partial_fill``, the overflowing one's head."""

import pytest

from sglang_vpp.schedule import (
    ChunkSpec,
    ChunkingError,
    Controller,
    LinearAttentionCost,
    MicroBatch,
    Planner,
    dry_run,
    ControllerConfig,
    RequestSpec,
    build_layout,
    check_deadlock,
    default_chunker,
    get_policy,
    schedule_from_planner,
    validate_schedule,
)
from sglang_vpp.schedule.text import schedule_from_json, schedule_to_json

MODES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-taper"]
LENGTHS = [100, 300, 200, 700, 50, 400, 1500, 90, 60]


def _plan(mode, lengths, budget, num_ranks=2, arrivals=None, partial_fill=False):
    spec = get_policy(mode)
    layout = build_layout(num_ranks, 4 * num_ranks, spec.layout_kind)
    cost = LinearAttentionCost()
    chunker = default_chunker(spec, 512, layout, cost, max(lengths))
    planner = Planner(ControllerConfig(spec, layout, chunker, cost, token_budget=budget, partial_fill=partial_fill),
                      sees_transfers=True)
    for i, length in enumerate(lengths):
        planner.submit(RequestSpec(length, arrivals[i] if arrivals else 0.0))
    dry_run(planner)
    return planner, schedule_from_planner(planner)


def _mb(seq, request, tokens, last=True, index=0, start=0):
    return MicroBatch(seq, frozenset((request,)), start, tokens, last, chunk_index=index)


def test_whole_join_rules():
    layout = build_layout(2, 8, "contiguous")
    controller = Controller(get_policy("cpp"), layout, LinearAttentionCost(), token_budget=512)
    lead = _mb(0, "a", 200, start=512, index=1)
    assert controller.joining_tokens(lead, _mb(1, "b", 312)) == 312
    assert controller.joining_tokens(lead, _mb(1, "b", 313)) == 0, "over the budget"
    assert controller.joining_tokens(_mb(0, "a", 200, last=False), _mb(1, "b", 100)) == 0, "lead continues its request"
    assert controller.joining_tokens(lead, _mb(1, "b", 100, last=False)) == 0, "candidate not whole"
    assert controller.joining_tokens(lead, _mb(1, "b", 100, index=1, start=64)) == 0, "candidate not from its start"
    plain = Controller(get_policy("cpp"), layout, LinearAttentionCost())
    assert plain.joining_tokens(lead, _mb(1, "b", 10)) == 0, "no budget, no batching"


@pytest.mark.parametrize("mode", MODES)
def test_batched_plans_are_valid_and_complete_every_request(mode):
    planner, plan = _plan(mode, LENGTHS, 512)
    validate_schedule(plan)
    assert not check_deadlock(plan).deadlock
    assert set(planner.request_finish) == set(range(len(LENGTHS)))
    assert sum(c.total_tokens for c in plan.chunks) == sum(LENGTHS)
    assert all(c.total_tokens <= 512 for c in plan.chunks if c.batch)
    carried = [p.request_index for c in plan.chunks for p in c.parts if p.chunk_index == 0]
    assert sorted(carried) == list(range(len(LENGTHS))), "every request starts exactly once"
    # the batch lead ends its request; what joins is a whole request
    for c in plan.chunks:
        for part in c.batch:
            assert c.is_last and part.start == 0 and part.num_tokens == LENGTHS[part.request_index]
    assert any(c.batch for c in plan.chunks)


def test_batching_fills_the_budget_with_whole_requests_in_order():
    _, plan = _plan("cpp", LENGTHS, 512)
    forwards = [[p.request_index for p in c.parts] for c in plan.chunks]
    # 100+300 fit, 200 would make 600; 200 alone, 700 is chunked, its 188-token tail takes 50, 60 not next
    assert forwards[:2] == [[0, 1], [2]]
    assert [p.request_index for p in plan.chunks[3].parts] == [3, 4]
    _, unbatched = _plan("cpp", LENGTHS, None)
    assert not any(c.batch for c in unbatched.chunks) and len(unbatched.chunks) > len(plan.chunks)


def test_a_request_that_has_not_arrived_does_not_join():
    arrivals = [0.0, 10.0, 10.0]
    _, plan = _plan("cpp", [100, 100, 100], 512, arrivals=arrivals)
    assert [[p.request_index for p in c.parts] for c in plan.chunks] == [[0], [1, 2]]


def test_batched_forward_costs_one_forward_with_each_requests_prefix():
    cost = LinearAttentionCost(linear_per_token=1.0, attention_per_pair=0.01, fixed_per_chunk=5.0)
    stage = build_layout(1, 2, "contiguous").stages[0]
    a, b = ChunkSpec(0, 1, 300, 100, True), ChunkSpec(1, 0, 0, 200, True)
    batch = ChunkSpec(0, 1, 300, 100, True, (b,))
    separate = cost.stage_cost(stage, a) + cost.stage_cost(stage, b)
    assert cost.stage_cost(stage, batch) == pytest.approx(separate - 5.0), "the per-forward cost is paid once"
    whole = ChunkSpec(0, 1, 300, 300, True)
    assert cost.stage_cost(stage, batch) < cost.stage_cost(stage, whole), "b does not attend over a's prefix"
    assert batch.total_tokens == 300 and [p.request_index for p in batch.parts] == [0, 1]


def test_json_round_trip_keeps_the_batch():
    _, plan = _plan("vpp-pack", LENGTHS, 512)
    again = schedule_from_json(schedule_to_json(plan))
    assert again.chunks == plan.chunks


def test_partial_fill_rule_gives_the_head_that_fills_the_budget():
    layout = build_layout(2, 8, "contiguous")
    controller = Controller(get_policy("cpp"), layout, LinearAttentionCost(), token_budget=512, partial_fill=True)
    lead = _mb(0, "a", 200, start=512, index=1)
    assert controller.joining_tokens(lead, _mb(1, "b", 312)) == 312, "fits whole"
    assert controller.joining_tokens(lead, _mb(1, "b", 400)) == 312, "the head that fills the budget"
    assert controller.joining_tokens(_mb(0, "a", 512), _mb(1, "b", 10)) == 0, "no room left"
    assert controller.joining_tokens(_mb(0, "a", 200, last=False), _mb(1, "b", 400)) == 0, "lead continues"
    assert controller.joining_tokens(lead, _mb(1, "b", 400, last=False)) == 312, "a request of several chunks"
    assert controller.joining_tokens(lead, _mb(1, "b", 100, last=False)) == 100, "its first chunk, at most"
    assert controller.joining_tokens(lead, _mb(1, "b", 400, index=1)) == 0, "a request already started"
    whole_only = Controller(get_policy("cpp"), layout, LinearAttentionCost(), token_budget=512)
    assert whole_only.joining_tokens(lead, _mb(1, "b", 400)) == 0
    assert whole_only.joining_tokens(lead, _mb(1, "b", 100, last=False)) == 0, "whole prompts only"


@pytest.mark.parametrize("mode", MODES + ["vpp-stream"])
@pytest.mark.parametrize("num_ranks", [2, 3])
def test_partial_fill_plans_are_valid_and_every_token_runs_once_in_order(mode, num_ranks):
    planner, plan = _plan(mode, LENGTHS, 512, num_ranks=num_ranks, partial_fill=True)
    validate_schedule(plan)
    assert not check_deadlock(plan).deadlock
    assert set(planner.request_finish) == set(range(len(LENGTHS)))
    assert all(c.total_tokens <= 512 for c in plan.chunks)
    covered: dict[int, list[tuple[int, int, int, bool]]] = {}
    for c in plan.chunks:
        for part in c.parts:
            covered.setdefault(part.request_index, []).append((part.chunk_index, part.start, part.num_tokens, part.is_last))
    for request, parts in covered.items():
        assert [p[0] for p in sorted(parts)] == list(range(len(parts))), (request, parts)
        position = 0
        for index, start, tokens, is_last in sorted(parts):
            assert start == position and is_last == (index == len(parts) - 1), (request, parts)
            position += tokens
        assert position == LENGTHS[request]
    heads = [part for c in plan.chunks for part in c.batch if not part.is_last]
    assert heads, "no request started in a batch's leftover budget"
    # A head ends its forward; its rest runs first in the next one and completes the request then.
    order = [c.key for c in plan.chunks]
    for c in plan.chunks:
        if c.batch and not c.batch[-1].is_last:
            head = c.batch[-1]
            assert order[order.index(c.key) + 1] == (head.request_index, 1)
    assert schedule_from_json(schedule_to_json(plan)).chunks == plan.chunks


def test_partial_fill_carries_more_tokens_per_forward_in_budget_order():
    _, plan = _plan("cpp", [300, 300, 300], 512, partial_fill=True)
    assert [[(p.request_index, p.start, p.num_tokens) for p in c.parts] for c in plan.chunks] == [
        [(0, 0, 300), (1, 0, 212)], [(1, 212, 88), (2, 0, 300)]]
    planner, _ = _plan("cpp", [300, 300, 300], 512, partial_fill=True)
    # Request 1 completes with its rest, in the second forward, as request 2 does.
    assert planner.request_finish[1] == planner.request_finish[2] > planner.request_finish[0]
    _, whole = _plan("cpp", [300, 300, 300], 512)
    assert len(whole.chunks) == 3


def test_partial_fill_starts_a_long_prompt_and_cuts_its_rest_from_the_head():
    """A prompt of several chunks starts in the leftover too, and runs on in chunks of the
    chunker's size from the head's end, as SGLang's adder runs its chunked request on."""
    _, plan = _plan("cpp", [300, 1300, 300], 512, partial_fill=True)
    assert [[(p.request_index, p.start, p.num_tokens) for p in c.parts] for c in plan.chunks] == [
        [(0, 0, 300), (1, 0, 212)], [(1, 212, 512)], [(1, 724, 512)], [(1, 1236, 64), (2, 0, 300)]]
    assert [c.chunk_index for c in plan.chunks[1:]] == [1, 2, 3]
    _, whole = _plan("cpp", [300, 1300, 300], 512)
    assert [[(p.request_index, p.start, p.num_tokens) for p in c.parts] for c in whole.chunks] == [
        [(0, 0, 300)], [(1, 0, 512)], [(1, 512, 512)], [(1, 1024, 276)], [(2, 0, 300)]]


def _partial_fill_without_batching(entry):
    """Ask ``entry`` for partial fill without batching."""
    from sglang_vpp.runtime.spec import RequestArrival, RunSpec
    from sglang_vpp.schedule import build_schedule, controller_config
    from sglang_vpp.sim.runner import RunConfig

    layout = build_layout(2, 8, "contiguous")
    if entry == "controller_config":
        controller_config("cpp", layout, 512, None, 512, batching=False, partial_fill=True)
    elif entry == "build_schedule":
        build_schedule("cpp", 2, 8, [300, 300], 512, partial_fill=True)
    elif entry == "simulator":
        RunConfig(2, 512, batch_requests=False, partial_fill=True)
    elif entry == "runtime":
        RunSpec("tiny-qwen3", "cpp", 2, (RequestArrival(100, 0.0),), 64, batch_requests=False,
                partial_fill=True).check()


@pytest.mark.parametrize("entry, error", [
    ("controller_config", "ChunkingError"), ("build_schedule", "ChunkingError"),
    ("simulator", "SimError"), ("runtime", "RunConfigError"),
])
def test_partial_fill_without_batching_is_refused_by_the_core_and_the_executors(entry, error):
    """A library caller of the schedule core gets the executors' refusal, each in its own type."""
    from sglang_vpp.schedule.factory import PARTIAL_FILL_NEEDS_BATCHING

    with pytest.raises(ValueError) as caught:
        _partial_fill_without_batching(entry)
    assert type(caught.value).__name__ == error
    assert "no batch" in str(caught.value)
    if error == "ChunkingError":  # a library caller is told its arguments' names, not flags
        assert str(caught.value).startswith("partial_fill needs batching=True"), str(caught.value)
    else:
        assert str(caught.value) == PARTIAL_FILL_NEEDS_BATCHING
        assert PARTIAL_FILL_NEEDS_BATCHING.startswith("--partial-fill needs --batch-requests")


def test_partial_fill_with_the_controllers_own_batches_is_not_refused():
    """``forward_batches=False`` only says what ``auto`` plans; the controller still forms the
    batches of ``batching``, so their partial fill stands."""
    from sglang_vpp.schedule import controller_config

    config = controller_config("cpp", build_layout(2, 8, "contiguous"), 512, None, 512, batching=True,
                               forward_batches=False, partial_fill=True)
    assert config.partial_fill and config.token_budget == 512


def test_a_server_config_plans_partial_fill_for_the_batches_sglang_forms():
    """The server's controller forms no batches (no token budget), but ``auto`` plans SGLang's,
    so its partial fill is not refused."""
    from sglang_vpp.schedule import server_controller_config

    config = server_controller_config("vpp", build_layout(2, 8, "foldback"), 4096, None, auto_chunk=True)
    assert config.partial_fill and config.token_budget is None


@pytest.mark.parametrize("budget", [0, -512, 512.0])
@pytest.mark.parametrize("entry", ["controller", "build_controller", "planner"])
def test_every_controller_refuses_a_token_budget_that_is_no_chunk_size(entry, budget):
    """The token budget is SGLang's chunked-prefill size: one rule with the chunk size's."""
    from sglang_vpp.schedule import build_controller, check_chunk_size

    with pytest.raises(ChunkingError) as rule:
        check_chunk_size(budget, "token_budget")
    spec, layout, cost = get_policy("cpp"), build_layout(2, 8, "contiguous"), LinearAttentionCost()
    config = ControllerConfig(spec, layout, default_chunker(spec, 64, layout, cost, 64), cost, token_budget=budget)
    build = {"controller": lambda: Controller(spec, layout, cost, token_budget=budget),
             "build_controller": lambda: build_controller(config), "planner": lambda: Planner(config)}[entry]
    with pytest.raises(ChunkingError) as caught:
        build()
    assert str(caught.value) == str(rule.value)


def _fills_by_default(entry, batching):
    """Whether ``entry``, told nothing about partial fill, plans filled batches."""
    from sglang_vpp.runtime.bench_config import BenchConfig
    from sglang_vpp.runtime.control import run_controller_config
    from sglang_vpp.runtime.spec import RequestArrival, RunSpec
    from sglang_vpp.schedule import build_schedule, controller_config
    from sglang_vpp.schedule.auto_size import auto_chunker
    from sglang_vpp.sim.runner import RunConfig

    layout = build_layout(2, 8, "contiguous")
    if entry == "controller_config":
        return controller_config("cpp", layout, 512, None, 512, batching=batching).partial_fill
    if entry == "build_schedule":  # 300 + the head of the next: a forward with a head, only when filling
        schedule = build_schedule("cpp", 2, 8, [300, 300, 300], 512, batching=batching)
        return any(not part.is_last for chunk in schedule.chunks for part in chunk.batch)
    if entry == "auto_chunker":
        return auto_chunker(get_policy("cpp"), layout, LinearAttentionCost(), 512, batch=batching).sizer.partial_fill
    if entry == "simulator":
        return RunConfig(2, 512, batch_requests=batching).fills
    if entry == "runtime":
        spec = RunSpec("tiny-qwen3", "cpp", 2, (RequestArrival(100, 0.0),), 64, batch_requests=batching)
        return run_controller_config(spec, layout).partial_fill
    return BenchConfig(num_ranks=2, seq_len=100, chunk_size=64, batch_requests=batching).fills


@pytest.mark.parametrize("entry", ["controller_config", "build_schedule", "auto_chunker", "simulator", "runtime",
                                   "bench"])
def test_every_entry_fills_wherever_it_batches_unless_told(entry):
    """One rule (``factory.fills_batches``): a batch starts the request that overflows it, as
    SGLang's prefill adder does, wherever requests are batched; without batches nothing fills."""
    from sglang_vpp.schedule.factory import fills_batches

    assert (fills_batches(None, True), fills_batches(None, False), fills_batches(False, True),
            fills_batches(True, True)) == (True, False, False, True)
    assert _fills_by_default(entry, True) is True
    assert _fills_by_default(entry, False) is False
