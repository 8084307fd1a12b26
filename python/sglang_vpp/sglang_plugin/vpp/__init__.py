"""VPP inside SGLang: ``--pp-mode vpp | vpp-async | vpp-pack | vpp-taper | vpp-stream`` with fold-back layer ownership.

``install(server_args)`` is called by the plugin (``process_hooks.setup_scheduler_process``) in
each scheduler process before the distributed groups and the model exist; it registers the
hooks below with SGLang's ``HookRegistry`` (the caller applies them). Nothing of SGLang is
copied: every change is a hook on one of these targets (paths under ``sglang.srt``):

    distributed.parallel_state.initialize_model_parallel  AFTER   stage view + comm communicator
    distributed.utils.get_pp_indices                      AROUND  hull / forced stage range
    utils.common.make_layers                              AROUND  one layer stack per owned stage
    model_loader.loader.DefaultModelLoader._get_all_weights AROUND drop unowned layers' weights
    model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size AROUND owned count
    mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal AROUND K/V for owned layers
    mem_cache.memory_pool.MLATokenToKVPool._create_buffers AROUND MLA latent for owned layers
    model_executor.model_runner.ModelRunner.load_model    AFTER   refuse unsupported models, graph capture
    model_executor.model_runner.ModelRunner.alloc_memory_pool AROUND refuse a pool not allocated above
    model_executor.forward_batch_info.ForwardBatch.init_new AROUND reuse a batch's ForwardBatch
    managers.scheduler._dispatch_event_loop_once          AROUND  the VPP event loop
    managers.schedule_policy.PrefillAdder.add_one_req     AROUND  vpp-taper: a request's first chunk
                                                                  from the controller (chunk_sizing.py)
    managers.schedule_batch.ScheduleBatch.retract_decode  AROUND  retract, not abort, a slot's last
                                                                  decode request while others hold KV
                                                                  (retraction.py)
    disaggregation.utils.poll_and_all_reduce_prefill_pp   AROUND  PD prefill: rank 0's logged
                                                                  bootstrap verdict (pd_prefill.py)
    disaggregation.prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk AROUND PD prefill:
                                                                  a chunk's KV is sent once both
                                                                  of the rank's stages ran

See docs/sglang-vpp.md for the design and its limits.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_vpp.schedule import Fold

from .errors import CommTimeoutError, SchedulerDivergenceError, VppConfigError
from .state import VPP_MODES, VppConfig, VppState, get_state, load_cost_profile, set_state

logger = logging.getLogger(__name__)

__all__ = [
    "install",
    "check_args",
    "VppConfig",
    "VppConfigError",
    "CommTimeoutError",
    "SchedulerDivergenceError",
]

_P = "sglang.srt."


def _options(server_args: Any) -> tuple[str, tuple[int, ...] | None, str | None, float | None, str | None, bool, Fold]:
    from sglang_vpp.sglang_plugin.options import options_of

    options = options_of(server_args)
    return (str(options.pp_mode), options.vpp_layer_split, options.vpp_trace, options.vpp_comm_timeout,
            options.vpp_cost_profile, options.vpp_auto_chunk, options.vpp_fold)


def _refuse_unsupported(server_args: Any, mode: str, resolved: bool = False) -> None:
    """The plugin's one refusal list (``validate.VPP_REFUSALS``) plus what needs chunked prefill;
    ``resolved``: ``server_args`` are SGLang's resolved arguments (a scheduler process)."""
    from sglang_vpp.sglang_plugin.validate import check_vpp_features, chunked_prefill_refusal

    check_vpp_features(server_args, mode, resolved=resolved)
    chunked_refusal = chunked_prefill_refusal(server_args, mode, resolved=resolved)
    if chunked_refusal:
        raise VppConfigError(chunked_refusal)


def _refuse_missing_hook_targets(mode: str) -> None:
    """Every SGLang name the VPP mode relies on must be there as declared (``surface.py``)."""
    from sglang_vpp.sglang_plugin.surface import Scope, find_problems, refusal

    problems = find_problems((Scope.EVERY_MODE, Scope.VPP))
    if problems:
        raise VppConfigError(refusal(mode, problems))


def _refuse_sparse_attention(args: Any, mode: str) -> None:
    """A DSA model whose config is readable here is refused before any rank loads its weights."""
    from sglang_vpp.sglang_plugin.validate import local_model_config

    from .sparse_attention import sparse_attention_refusal, uses_sparse_attention_cache

    config = local_model_config(getattr(args, "model_path", None), bool(getattr(args, "trust_remote_code", False)))
    if config is not None and uses_sparse_attention_cache(config):
        architectures = config.get("architectures") or ["this model"]
        raise VppConfigError(sparse_attention_refusal(mode, str(architectures[0])))


def check_args(args: Any, options: Any) -> None:
    """Launcher-side checks before anything loads (called by the plugin's validation)."""
    mode = str(options.pp_mode)
    config = VppConfig(mode=mode, pp_size=int(getattr(args, "pp_size", 1)), layer_split=options.vpp_layer_split,
                       fold=options.vpp_fold, cost_profile=options.vpp_cost_profile)
    _refuse_unsupported(args, mode)
    _refuse_missing_hook_targets(mode)
    _refuse_sparse_attention(args, mode)
    if options.vpp_cost_profile:
        from sglang_vpp.sglang_plugin.validate import model_num_layers

        num_layers = model_num_layers(getattr(args, "model_path", None), bool(getattr(args, "trust_remote_code", False)))
        if num_layers is None:  # a remote model: its layout, and the profile's fit to it, come at start-up
            load_cost_profile(options.vpp_cost_profile)  # unreadable: one-line refusal at launch
        else:  # the scheduler's own choice on this layout: unreadable or fitted for another, refused here
            state = VppState(config=config)
            state.ensure_layout(num_layers)
            state.cost()


def install(server_args: Any) -> None:
    """Register the VPP hooks in this scheduler process (idempotent)."""
    if get_state() is not None:
        return
    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    from . import ownership as own
    from .event_loop import run_vpp_event_loop
    from .grammar_sync import GRAMMAR_PP_SYNC, around_pp_sync_ready_failed
    from .retraction import RETRACT_DECODE, around_retract_decode
    from .stage_runner import around_forward_batch_init_new

    mode, split, trace, timeout, cost_profile, auto_chunk, fold = _options(server_args)
    if mode not in VPP_MODES:
        raise VppConfigError(f"install() called for --pp-mode {mode}; expected one of {VPP_MODES}")
    _refuse_unsupported(server_args, mode, resolved=True)
    _refuse_missing_hook_targets(mode)
    config = VppConfig.from_env(mode, int(server_args.pp_size), split, fold)
    overrides = {"comm_timeout_s": float(timeout)}  # options.resolve_comm_timeout: flag > env > default
    if trace:
        overrides["trace_dir"] = trace
    if cost_profile:
        overrides["cost_profile"] = cost_profile
    if auto_chunk:
        overrides["auto_chunk"] = True
    if str(getattr(server_args, "device", None) or "") == "cpu":
        overrides["on_cpu"] = True
    from dataclasses import replace

    config = replace(config, **overrides)
    set_state(VppState(config=config, node_rank=int(getattr(server_args, "node_rank", 0) or 0)))

    def around_dispatch(original, scheduler):
        return run_vpp_event_loop(scheduler, get_state())

    register = register_hook
    register(_P + "distributed.parallel_state.initialize_model_parallel", own.after_initialize_model_parallel, HookType.AFTER)
    register(_P + "distributed.utils.get_pp_indices", own.around_get_pp_indices, HookType.AROUND)
    register(_P + "utils.common.make_layers", own.around_make_layers, HookType.AROUND)
    register(_P + "model_loader.loader.DefaultModelLoader._get_all_weights", own.around_get_all_weights, HookType.AROUND)
    register(
        _P + "model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
        own.around_compute_cell_size, HookType.AROUND,
    )
    register(
        _P + "mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal",
        own.around_create_buffers_normal, HookType.AROUND,
    )
    register(_P + "mem_cache.memory_pool.MLATokenToKVPool._create_buffers", own.around_create_mla_buffers, HookType.AROUND)
    register(_P + "model_executor.model_runner.ModelRunner.load_model", own.after_load_model, HookType.AFTER)
    register(_P + "model_executor.model_runner.ModelRunner.alloc_memory_pool", own.around_alloc_memory_pool,
             HookType.AROUND)
    register(
        _P + "model_executor.forward_batch_info.ForwardBatch.init_new",
        around_forward_batch_init_new, HookType.AROUND,
    )
    register(_P + "managers.scheduler._dispatch_event_loop_once", around_dispatch, HookType.AROUND)
    register(RETRACT_DECODE, around_retract_decode, HookType.AROUND)
    register(GRAMMAR_PP_SYNC, around_pp_sync_ready_failed, HookType.AROUND)
    if getattr(server_args, "disaggregation_mode", None) == "prefill":
        from . import pd_prefill

        register(pd_prefill.POLL_PREFILL_PP, pd_prefill.around_poll_prefill_pp, HookType.AROUND)
        register(pd_prefill.SEND_KV_CHUNK, pd_prefill.around_send_kv_chunk, HookType.AROUND)
        from sglang_vpp.sglang_plugin.pd_guard import refuses_other_attn_tp

        if refuses_other_attn_tp(server_args):  # what the decode side's guard reads from the bootstrap server
            register(pd_prefill.SEND_KVCACHE_SLICE, pd_prefill.around_send_kvcache_slice, HookType.AROUND)
    if config.policy.tapered_chunks or config.auto_chunk:
        from . import chunk_sizing

        register(chunk_sizing.ADD_ONE_REQ, chunk_sizing.around_add_one_req, HookType.AROUND)
    logger.info("sglang-vpp: %s hooks registered (pp=%d)", mode, config.pp_size)
