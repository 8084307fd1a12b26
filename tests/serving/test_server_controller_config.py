"""``check --trace`` proves a server obeyed its controller only if it replays the controller the
server built: both build it with ``server_controller_config``, and the configuration rebuilt from
a server's recorded controller inputs equals the server's own."""

from dataclasses import fields

import pytest

from sglang_vpp.schedule import (
    FOLDBACK_MODES,
    GROUP_BACKWARD,
    GROUP_FORWARD,
    ControllerConfig,
    Fold,
    build_controller,
    build_layout,
    get_policy,
)
from sglang_vpp.schedule.auto_size import SERVER_CAP, AutoChunker
from sglang_vpp.schedule.factory import SERVER_NUM_GROUPS, server_controller_config
from sglang_vpp.serving.decision_replay import _controller_config
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState


def _comparable(config: ControllerConfig) -> dict:
    """``config`` as data: an ``auto`` chunker is a live object (it keeps its choices), so it is
    compared by what its sizer was built from."""
    out = {f.name: getattr(config, f.name) for f in fields(ControllerConfig)}
    if isinstance(config.chunker, AutoChunker):
        sizer = config.chunker.sizer
        out["chunker"] = (AutoChunker, sizer.policy, sizer.layout, sizer.cost, sizer.chunker_for, sizer.max_in_flight,
                          sizer.candidates, sizer.window, sizer.batch, sizer.taper_for, sizer.partial_fill)
    return out


@pytest.mark.parametrize("mode", [str(mode) for mode in FOLDBACK_MODES])
@pytest.mark.parametrize("fold", [Fold.SPLIT, Fold.FUSED])
@pytest.mark.parametrize("auto_chunk, on_cpu", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("decodes, max_in_flight", [(True, None), (False, 3)])
def test_the_replay_rebuilds_the_config_the_server_built(mode, fold, auto_chunk, on_cpu, decodes, max_in_flight):
    state = VppState(config=VppConfig(mode=mode, pp_size=2, fold=fold, auto_chunk=auto_chunk, on_cpu=on_cpu,
                                      max_in_flight=max_in_flight), rank=0)
    state.ensure_layout(8)
    server = state.controller_config(SERVER_CAP if auto_chunk else 64, decodes)
    replayed = _controller_config(state.controller_inputs(build_controller(server)))
    assert _comparable(replayed) == _comparable(server)


@pytest.mark.parametrize("mode", [str(mode) for mode in FOLDBACK_MODES])
@pytest.mark.parametrize("auto_chunk", [False, True])
def test_a_server_controller_has_one_group_per_direction_and_leaves_batching_to_sglang(mode, auto_chunk):
    layout = build_layout(2, 8, get_policy(mode).layout_kind)
    config = server_controller_config(mode, layout, 64, None, auto_chunk=auto_chunk)
    assert config.num_groups == SERVER_NUM_GROUPS == 2 and config.token_budget is None
    if auto_chunk:  # auto plans SGLang's batching: whole short requests and the overflowing one's head
        assert config.chunker.sizer.batch and config.chunker.sizer.partial_fill
        assert max(config.chunker.sizer.candidates) <= 64


@pytest.mark.parametrize("mode", [str(mode) for mode in FOLDBACK_MODES])
@pytest.mark.parametrize("fold", [Fold.SPLIT, Fold.FUSED])
def test_a_server_hand_offs_group_is_its_direction(mode, fold):
    """The server's loop and ``reproduce`` name a link by its hand-off's group: on a server's
    controller that is the direction, down the ranks (``fwd``) or back up (``bwd``)."""
    layout = build_layout(3, 12, "foldback", fold=fold)
    controller = build_controller(server_controller_config(mode, layout, 64, None))
    hand_offs = [controller.hand_off(stage) for stage in range(layout.num_stages)]
    for hand_off in filter(None, hand_offs):
        assert hand_off.group == (GROUP_FORWARD if hand_off.dst_rank > hand_off.src_rank else GROUP_BACKWARD)
    assert sum(hand_off is None for hand_off in hand_offs) == (1 if fold is Fold.FUSED else 2)  # last, fold point


def test_a_trace_without_the_partial_fill_field_replays_auto_planning_whole_requests():
    """A server's auto plans SGLang's partial fill and records it; a trace from before the field
    existed comes from a server whose auto planned whole requests, and replays so."""
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True), rank=0)
    state.ensure_layout(8)
    inputs = state.controller_inputs(build_controller(state.controller_config(SERVER_CAP)))
    assert inputs["auto_partial_fill"] is True
    assert _controller_config(inputs).chunker.sizer.partial_fill
    old = {key: value for key, value in inputs.items() if key != "auto_partial_fill"}
    assert not _controller_config(old).chunker.sizer.partial_fill
