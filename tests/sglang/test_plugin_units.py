"""Plugin pieces that need no SGLang: options, validation, the VPP seam, version pin, shims."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_vpp.schedule import Policy
from sglang_vpp.sglang_plugin.errors import PluginError, PpModeError, SGLangVersionError
from sglang_vpp.sglang_plugin.options import (
    PipelineOptions,
    PpMode,
    SERVED_MODES,
    attach,
    is_vpp_mode,
    options_of,
    parse_layer_split,
)
from sglang_vpp.sglang_plugin.validate import (
    VPP_REFUSALS,
    model_num_layers,
    turn_graph_capture_off,
    validate_pipeline_args,
)
from sglang_vpp.sglang_plugin.version import SUPPORTED_SGLANG_VERSION, check_sglang_version


def _args(model_dir: Path | None = None, **kwargs) -> argparse.Namespace:
    base = {refusal.attr: None for refusal in VPP_REFUSALS}  # every refused flag exists on ServerArgs
    base.update(pp_size=1, chunked_prefill_size=None, model_path=str(model_dir) if model_dir else None)
    base.update(kwargs)
    return argparse.Namespace(**base)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 8}))
    return tmp_path


def test_modes_are_the_schedule_policies():
    assert PpMode is Policy
    assert [is_vpp_mode(m) for m in SERVED_MODES] == [False, False, True, True, True, True, True]
    assert set(SERVED_MODES) == set(Policy)


def test_layer_split_parsing():
    assert parse_layer_split("3, 2,2,1") == (3, 2, 2, 1)
    assert parse_layer_split(None) is None
    with pytest.raises(PpModeError, match="not a comma-separated list"):
        parse_layer_split("3;2")
    with pytest.raises(PpModeError, match="at least 1 layer"):
        parse_layer_split("3,0,2,1")


def test_options_default_to_stock_and_survive_pickling():
    record = argparse.Namespace()  # stands in for ServerArgs: a picklable object with a __dict__
    assert options_of(record) == PipelineOptions()
    options = PipelineOptions(pp_mode="vpp-pack", vpp_layer_split=[2, 2, 2, 2], vpp_trace="/tmp/t")
    attach(record, options)
    copy = pickle.loads(pickle.dumps(record))
    assert options_of(copy) == options and options_of(copy).pp_mode is Policy.VPP_PACK
    assert options_of(copy).vpp_layer_split == (2, 2, 2, 2)


@pytest.mark.parametrize(
    "mode,kwargs,message",
    [
        ("vpp", dict(pp_size=1), "--pp-size is 1"),
        ("dcpp", dict(pp_size=1), "--pp-size is 1"),
        ("vpp-async", dict(pp_size=2, chunked_prefill_size=-1), "chunked prefill is disabled"),
        ("vpp", dict(pp_size=2, enable_lora=True), "does not support --enable-lora"),
        ("vpp", dict(pp_size=2, attn_dp_size=2), "does not support --attn-dp-size"),
        ("vpp", dict(pp_size=2, enable_dynamic_chunking=True), "--enable-dynamic-chunking"),
        ("vpp", dict(pp_size=8), "needs at least 16 layers"),
    ],
)
def test_refusals_name_the_value_and_the_fix(model_dir, mode, kwargs, message):
    with pytest.raises(PpModeError, match=message) as info:
        validate_pipeline_args(_args(model_dir, **kwargs), PipelineOptions(pp_mode=mode))
    assert isinstance(info.value, ValueError) and isinstance(info.value, PluginError)


def test_layer_split_must_match_stages_and_layers(model_dir):
    ok = PipelineOptions(pp_mode="vpp", vpp_layer_split=(3, 1, 1, 3))
    validate_pipeline_args(_args(model_dir, pp_size=2), ok)  # 8 layers, 4 stages: accepted
    with pytest.raises(PpModeError, match="covers 9 layers but the model has 8; make the counts add up to 8"):
        validate_pipeline_args(_args(model_dir, pp_size=2), PipelineOptions("vpp", (3, 2, 1, 3)))
    with pytest.raises(PpModeError, match="has 4 entries but --pp-size 4 has 8 virtual stages"):
        validate_pipeline_args(_args(model_dir, pp_size=4), ok)
    with pytest.raises(PpModeError, match="only applies to --pp-mode vpp"):
        validate_pipeline_args(_args(model_dir, pp_size=2), PipelineOptions("cpp", (4, 4)))


def test_too_few_layers_for_the_split_fold_names_the_fused_fold_that_holds_them(tmp_path):
    """A model of 2P-1 layers: the split fold's 2P stages cannot hold it, a fused fold's 2P-1
    stages of one layer each can (served: 3 layers at pp 2), so the refusal names that command."""
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 7}))
    with pytest.raises(PpModeError, match=r"needs at least 8 layers .* has 7; lower --pp-size, or serve the 7 "
                                          r"virtual stages of a fused fold: --vpp-fold fused --vpp-layer-split 1,1,1,1,1,1,1$"):
        validate_pipeline_args(_args(tmp_path, pp_size=4), PipelineOptions(pp_mode="vpp-pack"))
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 3}))
    with pytest.raises(PpModeError, match=r"has 3; lower --pp-size, or serve .* --vpp-layer-split 1,1,1$"):
        validate_pipeline_args(_args(tmp_path, pp_size=2), PipelineOptions(pp_mode="vpp-pack", vpp_fold="fused"))
    validate_pipeline_args(_args(tmp_path, pp_size=2), PipelineOptions("vpp-pack", (1, 1, 1), vpp_fold="fused"))
    with pytest.raises(PpModeError, match=r"needs at least 6 layers .* has 3; lower --pp-size$"):
        validate_pipeline_args(_args(tmp_path, pp_size=3), PipelineOptions(pp_mode="vpp-pack"))


def test_stock_and_dcpp_accept_their_usual_flags(model_dir):
    validate_pipeline_args(_args(model_dir), PipelineOptions())
    validate_pipeline_args(_args(model_dir, pp_size=2, chunked_prefill_size=128), PipelineOptions("dcpp"))


def test_model_num_layers_reads_nested_text_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 6}}))
    assert model_num_layers(str(tmp_path)) == 6
    assert model_num_layers(None) is None
    assert model_num_layers(str(tmp_path / "absent-model-id")) is None


def test_version_pin():
    assert check_sglang_version(SUPPORTED_SGLANG_VERSION) == "0.5.23"
    with pytest.raises(SGLangVersionError, match="supports SGLang 0.5.23 only, found 0.5.24"):
        check_sglang_version("0.5.24")


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="torchvision not installed")
def test_torchvision_import_shim():
    import torch

    from sglang_vpp.sglang_plugin.torch_autoload import _torchvision_extension_loads

    spec = importlib.util.find_spec("torchvision")
    extension_loads = torch.version.cuda is not None or _torchvision_extension_loads(Path(spec.origin).parent)
    command = [sys.executable, "-c", "import torchvision.transforms"]
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    if not extension_loads:
        # Negative control: without the autoload entry point, the CUDA wheel does not import.
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode != 0 and "torchvision::nms" in done.stderr


def test_dcpp_profile_is_retried_until_sglang_accepts_a_fit(monkeypatch):
    from sglang_vpp.sglang_plugin import dcpp

    outcomes = iter([False, False, True])
    calls = []

    def profile_and_fit(sizer):
        calls.append(sizer)
        return next(outcomes)

    waits = []
    monkeypatch.setattr(dcpp, "_sleep", waits.append)
    monkeypatch.delenv(dcpp.ATTEMPTS_ENV, raising=False)
    assert dcpp.profile_attempts() == dcpp.DEFAULT_ATTEMPTS == 5
    assert dcpp.around_profile_and_fit(profile_and_fit, "sizer") is True
    assert calls == ["sizer"] * 3
    assert waits == [0.5, 1.0]  # a wait after each rejected fit, none after the accepted one


def test_dcpp_retry_waits_double_up_to_four_seconds(monkeypatch):
    from sglang_vpp.sglang_plugin import dcpp

    waits = []
    monkeypatch.setattr(dcpp, "_sleep", waits.append)
    monkeypatch.setenv(dcpp.ATTEMPTS_ENV, "8")
    assert dcpp.around_profile_and_fit(lambda sizer: False, "s") is False
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]  # none after the last profile


def test_dcpp_profile_gives_up_after_the_attempts(monkeypatch):
    from sglang_vpp.sglang_plugin import dcpp

    calls = []
    monkeypatch.setattr(dcpp, "_sleep", lambda s: None)
    monkeypatch.setenv(dcpp.ATTEMPTS_ENV, "2")
    assert dcpp.around_profile_and_fit(lambda sizer: calls.append(sizer) or False, "s") is False
    assert len(calls) == 2
    monkeypatch.setenv(dcpp.ATTEMPTS_ENV, "zero")
    with pytest.raises(ValueError, match="SGLANG_VPP_DCPP_PROFILE_ATTEMPTS='zero'"):
        dcpp.profile_attempts()


def test_rank_accounting_rewrites_its_files_only_when_something_is_new(tmp_path):
    import os

    from sglang_vpp.sglang_plugin.accounting import RankAccounting

    acct = RankAccounting(rank=1, trace_dir=str(tmp_path))
    acct.write()
    assert not list(tmp_path.iterdir())  # nothing recorded yet: no files
    with acct.timed(stage=1, seq=0, is_prefill=True, num_tokens=64):
        pass
    acct.write()
    path = tmp_path / "vpp_rank1.records.json"
    os.utime(path, (0, 0))
    acct.write()
    assert path.stat().st_mtime == 0  # unchanged: not rewritten
    acct.counters["num_packed"] = 1
    acct.write()
    assert path.stat().st_mtime > 0  # a counter changed: rewritten
    os.utime(path, (0, 0))
    acct.finish(acct.start(), stage=1, seq=1, is_prefill=False, num_tokens=1)
    acct.write()
    assert path.stat().st_mtime > 0 and '"seq": 1' in path.read_text()


# ----------------------------------------------------------------------------- hook safety
@pytest.mark.sglang
def test_every_hook_target_exists_in_the_installed_sglang():
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    from sglang_vpp.sglang_plugin.hook_targets import find_target_problems
    from sglang_vpp.sglang_plugin.surface import Scope

    assert find_target_problems(tuple(Scope)) == []


def test_every_hook_registration_goes_through_the_target_list():
    """A hook registered any other way would escape the start-up checks."""
    root = Path(__file__).resolve().parents[2] / "python" / "sglang_vpp"
    direct = [str(path) for path in root.rglob("*.py")
              if "HookRegistry.register(" in path.read_text() and path.name != "hook_targets.py"]
    assert direct == []


@pytest.mark.sglang
def test_vpp_refuses_a_missing_hook_target_and_stock_modes_do_not(monkeypatch, model_dir):
    utils = pytest.importorskip("sglang.srt.distributed.utils")
    monkeypatch.delattr(utils, "get_pp_indices")
    from sglang_vpp.sglang_plugin import vpp

    with pytest.raises(ValueError, match=r"sglang\.srt\.distributed\.utils\.get_pp_indices is missing") as info:
        vpp.check_args(_args(model_dir, pp_size=2, chunked_prefill_size=64), PipelineOptions(pp_mode="vpp-async"))
    assert "--pp-mode vpp-async cannot hook this SGLang" in str(info.value) and "--pp-mode cpp" in str(info.value)
    validate_pipeline_args(_args(model_dir, pp_size=2), PipelineOptions())  # cpp: no VPP check runs


@pytest.mark.sglang
def test_a_hook_sglang_did_not_apply_refuses_vpp(monkeypatch):
    registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    from collections import defaultdict

    from sglang_vpp.sglang_plugin import hook_targets, process_hooks
    from sglang_vpp.sglang_plugin.surface import Scope

    monkeypatch.setattr(registry.HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(registry.HookRegistry, "_patched", set())
    monkeypatch.setattr(hook_targets, "_registered", {})
    target = "sglang.srt.managers.scheduler._dispatch_event_loop_once"
    hook_targets.register_hook(target, lambda original, scheduler: None, registry.HookType.AROUND)
    assert hook_targets.find_unapplied(tuple(Scope)) == [target]  # registered, never applied
    with pytest.raises(ValueError, match="did not apply the plugin's hook on " + target.replace(".", r"\.")):
        process_hooks._check_hooks_applied(PipelineOptions(pp_mode="vpp"))
    process_hooks._check_hooks_applied(PipelineOptions())  # stock modes only log it


@pytest.mark.sglang
def test_each_hook_is_registered_once_however_often_its_install_runs(monkeypatch):
    """Set-up may run twice in a scheduler process (``publish`` for another record): a hook
    registered twice would wrap its target twice (SGLang chains every registration)."""
    registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
    from collections import defaultdict
    from types import SimpleNamespace as ns

    from sglang_vpp.sglang_plugin import dcpp, hook_targets, pd_abort, pd_decode_refusal, pd_layers

    monkeypatch.setattr(registry.HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(registry.HookRegistry, "_patched", set())
    monkeypatch.setattr(hook_targets, "_registered", {})
    monkeypatch.setattr(hook_targets, "_hooked", set(), raising=False)
    for _ in range(2):
        dcpp.install_dcpp_hooks()
        assert pd_abort.install_pd_abort_hook(ns(disaggregation_mode="prefill", pp_size=2))
        assert pd_decode_refusal.install_decode_refusal_hook(ns(disaggregation_mode="decode"))
        assert pd_layers.register_pd_layer_hooks(ns(disaggregation_mode="prefill"))
    hooks = registry.HookRegistry._hooks
    assert set(hooks) == {dcpp._TARGET, pd_abort.PREFILL_CHUNK_TARGET, pd_decode_refusal.ENSURE_PREFILL_INFO_TARGET,
                          *pd_layers.PD_LAYER_HOOK_TARGETS}
    assert {target: len(entries) for target, entries in hooks.items() if len(entries) != 1} == {}
    # A target's other hook is its own registration.
    hook_targets.register_hook(pd_abort.PREFILL_CHUNK_TARGET, lambda *args, **kwargs: None, registry.HookType.BEFORE)
    assert len(hooks[pd_abort.PREFILL_CHUNK_TARGET]) == 2


@pytest.mark.sglang
def test_an_unreadable_cost_profile_is_refused_at_launch(model_dir, tmp_path):
    from sglang_vpp.sglang_plugin import vpp

    options = PipelineOptions(pp_mode="vpp-pack", vpp_cost_profile=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="--vpp-cost-profile .*missing.json.* is not a readable fitted cost model"):
        vpp.check_args(_args(model_dir, pp_size=2, chunked_prefill_size=64), options)


@pytest.mark.sglang
def test_a_cost_profile_fitted_for_another_layout_is_refused_at_launch(model_dir, tmp_path):
    """The launcher reads the local model's depth, so the scheduler's own check (every stage of
    the fold-back layout has a fit) runs before anything loads."""
    from sglang_vpp.sglang_plugin import vpp
    from sglang_vpp.sim.cost.fitted import Coefficients, FittedCostModel

    path = tmp_path / "costs.json"
    fit = Coefficients(2e-9, 3e-7, 1e-4, 5, 0.0, 64)  # a contiguous stage of 64 layers: no model here has it
    FittedCostModel({0: fit, 1: fit}).save(path)
    options = PipelineOptions(pp_mode="vpp-pack", vpp_cost_profile=str(path))
    with pytest.raises(ValueError, match=r"--vpp-cost-profile '.*costs.json' was fitted for stages 0 \(64 layers\), "
                                         r"1 \(64 layers\) with no per-layer fit; used with a model of \d+ layers in 4 "
                                         r"foldback stages"):
        vpp.check_args(_args(model_dir, pp_size=2, chunked_prefill_size=64), options)


@pytest.mark.parametrize("flags, named", [
    ({"cuda_graph_backend_decode": "full"}, "--cuda-graph-backend-decode (got 'full')"),
    ({"cuda_graph_backend_prefill": "breakable"}, "--cuda-graph-backend-prefill (got 'breakable')"),
    ({"cuda_graph_config": {"decode": {"backend": "full"}}}, "--cuda-graph-config"),
    ({"enable_torch_compile": True}, "--enable-torch-compile (got True)"),
])
def test_a_vpp_mode_refuses_a_graph_capture_asked_for(model_dir, flags, named):
    """A captured graph replays the rank's whole layer range: a stage's forward would run both."""
    import re

    args = _args(model_dir, pp_size=2, chunked_prefill_size=64, **flags)
    with pytest.raises(PpModeError, match=re.escape(named) + ".*replays the forward over the rank's whole layer range"):
        validate_pipeline_args(args, PipelineOptions(pp_mode="vpp-pack"))
    validate_pipeline_args(args, PipelineOptions(pp_mode="cpp"))  # stock PP captures as SGLang does


def test_a_vpp_mode_turns_graph_capture_off_itself(model_dir):
    args = _args(model_dir, pp_size=2, chunked_prefill_size=64, cuda_graph_backend_decode=None,
                 cuda_graph_backend_prefill="disabled")
    validate_pipeline_args(args, PipelineOptions(pp_mode="vpp"))  # "disabled" given by hand is no capture
    assert turn_graph_capture_off(args) == ["--cuda-graph-backend-decode disabled"]
    assert (args.cuda_graph_backend_decode, args.cuda_graph_backend_prefill) == ("disabled", "disabled")


@pytest.mark.sglang
def test_a_dsa_model_is_refused_at_launch_when_its_config_is_local(tmp_path):
    from sglang_vpp.sglang_plugin import vpp

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 8, "index_topk": 2048}))
    with pytest.raises(ValueError, match=r"^--pp-mode vpp-pack does not support model DeepseekV3ForCausalLM with "
                                         r"DeepSeek sparse attention"):
        vpp.check_args(_args(tmp_path, pp_size=2, chunked_prefill_size=64), PipelineOptions(pp_mode="vpp-pack"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                      "num_hidden_layers": 8}))
    vpp.check_args(_args(tmp_path, pp_size=2, chunked_prefill_size=64), PipelineOptions(pp_mode="vpp-pack"))


def test_the_cost_profile_help_states_the_default_choose_cost_makes():
    """Without --vpp-cost-profile, choose_cost picks the measured CPU estimate on CPU with auto chunks
    and the analytic one otherwise; the help quotes the factory's one description of that choice."""
    from sglang_vpp.schedule import LinearAttentionCost, build_layout
    from sglang_vpp.schedule.cpu_cost import cpu_serving_cost
    from sglang_vpp.schedule.factory import DEFAULT_COST_DESCRIPTION, choose_cost
    from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args

    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    (action,) = [a for a in parser._actions if "--vpp-cost-profile" in a.option_strings]
    assert action.help.endswith(f"Default: {DEFAULT_COST_DESCRIPTION}.")
    layout = build_layout(2, 8, "foldback")
    assert "--chunked-prefill-size auto on --device cpu, the CPU estimate" in DEFAULT_COST_DESCRIPTION
    assert choose_cost(layout, on_cpu=True, auto_chunk=True).model == cpu_serving_cost(layout)
    assert DEFAULT_COST_DESCRIPTION.endswith("otherwise the analytic linear + attention estimate")
    assert all(isinstance(choose_cost(layout, on_cpu=on_cpu, auto_chunk=auto).model, LinearAttentionCost)
               for on_cpu, auto in ((True, False), (False, True), (False, False)))


def test_one_week_bounds_every_timeout_of_the_cli_and_the_plugin(monkeypatch):
    """The CLI's timeouts and --vpp-comm-timeout share one bound (``timeouts.MAX_TIMEOUT_S``),
    kept where the CLI reads it without importing torch."""
    import subprocess
    import sys

    from sglang_vpp.cli.common import CliInputError, timeout_option
    from sglang_vpp.timeouts import MAX_TIMEOUT_S
    from sglang_vpp.sglang_plugin.options import resolve_comm_timeout

    monkeypatch.delenv("SGLANG_VPP_COMM_TIMEOUT_S", raising=False)
    assert MAX_TIMEOUT_S == 7 * 24 * 3600
    assert resolve_comm_timeout(MAX_TIMEOUT_S) == MAX_TIMEOUT_S
    timeout_option(MAX_TIMEOUT_S, "--timeout")
    with pytest.raises(PpModeError, match=r"in \(0, 604800\] \(a week\)"):
        resolve_comm_timeout(MAX_TIMEOUT_S + 1)
    with pytest.raises(CliInputError, match="at most 604800 s"):
        timeout_option(MAX_TIMEOUT_S + 1, "--timeout")
    code = "import sys, sglang_vpp.cli.app; assert 'torch' not in sys.modules, 'the CLI imported torch at start'"
    subprocess.run([sys.executable, "-c", code], check=True)
