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
