"""The SGLang surface: every SGLang name the project touches, what it relies on, and the check.

An SGLang upgrade that renames a function, changes its parameters or drops an attribute must
stop the server at start-up naming each such name, not fail at the first batch or run stock PP
quietly. So every name the plugin (``sglang_plugin/``) and ``serving/`` hook, call, read, write,
class-swap or replace is one ``SurfaceName`` in ``SURFACE`` (one line each), and:

- ``find_problems(scopes)`` resolves each name of those scopes on the installed SGLang: a hook,
  a call or a replaced function must exist with the declared leading parameters; an attribute
  must exist on its module, or on its class (a class attribute, a struct or dataclass field, or
  an attribute the class's own code assigns on ``self``, mixins included);
- ``scopes_for`` says which scopes a server needs (``cli_args`` checks them in the launcher,
  ``process_hooks`` again in each scheduler process, before the Scheduler exists);
- tests/sglang/test_surface.py reads the project's code and fails on an SGLang name that is
  used but not declared here, and drills an upgrade (renamed, re-signed, removed names);
- ``sglang-vpp doctor --sglang`` prints every name with its status on the installed SGLang.

``hook_targets.HOOK_TARGETS`` is the ``Use.HOOK`` part of this list. Importing this module
imports neither sglang nor torch.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import linecache
import os
import pkgutil
import sys
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = ["Scope", "Use", "SurfaceName", "SURFACE", "find_problems", "problem_of", "scopes_for", "refusal"]


class Scope(StrEnum):
    """When a name must be there (a server checks the scopes it will use)."""

    EVERY_MODE = "every-mode"  # argument parsing, the scheduler set-up, input guard, failure report
    GENERIC_CPU = "generic-cpu"  # only on SGLang's generic CPU platform
    DCPP = "dcpp"
    STOCK_TRACE = "stock-trace"  # cpp / dcpp with --vpp-trace
    STOCK_WATCHDOG = "stock-watchdog"  # cpp / dcpp with --pp-size > 1 (--vpp-comm-timeout)
    VPP = "vpp"
    SERVING = "serving"  # sglang-vpp bench-serve (checked before it starts a server)
    PD = "pd"  # --disaggregation-mode prefill or decode (the decode side's bootstrap guard)
    CPU_PD = "cpu-pd"  # --device cpu with --disaggregation-mode prefill (the KV sender guard)
    VPP_PD = "vpp-pd"  # a vpp* mode with --disaggregation-mode prefill (vpp/pd_prefill.py)


class Use(StrEnum):
    HOOK = "hook"  # registered with HookRegistry (hook_targets.register_hook)
    CALL = "call"  # called (a function, method or class)
    READ = "read"  # attribute read
    WRITE = "write"  # attribute assigned (read too, where it is)
    SWAP = "class-swap"  # the live object's class replaced by a subclass overriding ``params``
    REPLACE = "replace"  # a module function replaced in this process
    MODULE = "module"  # a module imported or run by path


@dataclass(frozen=True, slots=True)
class SurfaceName:
    path: str
    """Dotted path under ``sglang`` (``HookRegistry.register``'s spelling for hooks)."""
    use: Use
    scope: Scope
    params: tuple[str, ...] = ()
    """HOOK / CALL / REPLACE: the leading parameter names relied on, in order (a class: its
    constructor's, without ``self``). SWAP: the attributes the subclass overrides."""


_S = "sglang.srt."
_SCHED = _S + "managers.scheduler.Scheduler."
_BATCH = _S + "managers.schedule_batch.ScheduleBatch."
_REQ = _S + "managers.schedule_batch.Req."
_TM = _S + "managers.tokenizer_manager."
_PS = _S + "distributed.parallel_state."
_GROUP = _PS + "GroupCoordinator."
_ARGS = _S + "server_args.ServerArgs."
_BENCH = "sglang.benchmark.serving."
H, C, R, W, SW, RP, M = Use.HOOK, Use.CALL, Use.READ, Use.WRITE, Use.SWAP, Use.REPLACE, Use.MODULE
E, CPU, DC, TR, WD, V, SV, PD, CPD, VPD = (Scope.EVERY_MODE, Scope.GENERIC_CPU, Scope.DCPP, Scope.STOCK_TRACE,
                                           Scope.STOCK_WATCHDOG, Scope.VPP, Scope.SERVING, Scope.PD, Scope.CPU_PD,
                                           Scope.VPP_PD)
N = SurfaceName

SURFACE: tuple[SurfaceName, ...] = (
    # --- every mode: flags, options, scheduler set-up (cli_args, options, process_hooks, entry)
    N(_ARGS + "add_cli_args", H, E, ("parser",)),
    N(_ARGS + "from_cli_args", H, E, ("cls", "args")),
    N(_ARGS + "__reduce__", C, E),  # pickles the options attribute into every subprocess
    N(_ARGS + "pp_size", R, E),
    N(_ARGS + "device", R, E),
    N(_ARGS + "chunked_prefill_size", R, E),
    N(_ARGS + "enable_dynamic_chunking", W, E),  # dcpp switches it on
    N(_ARGS + "node_rank", R, V),
    N(_S + "runtime_context.publish", H, E, ("server_args", "role")),
    N(_S + "runtime_context.get_parallel", C, E),
    N(_S + "runtime_context.ParallelContext.pp_rank", R, E),
    N(_S + "runtime_context.ParallelContext.tp_rank", R, E),
    N(_S + "plugins.hook_registry.HookRegistry.register", C, E, ("cls", "target", "hook", "hook_type")),
    N(_S + "plugins.hook_registry.HookRegistry.apply_hooks", C, E),
    N(_S + "plugins.hook_registry.HookType.AFTER", R, E),
    N(_S + "plugins.hook_registry.HookType.AROUND", R, E),
    N(_S + "plugins.hook_registry.HookType.BEFORE", R, E),
    N(_S + "plugins.hook_registry.HookType", M, E),
    N(_S + "plugins.hook_registry.HookRegistry", M, E),
    N("sglang.version.__version__", R, E),
    # --- every mode: input guard (input_guard.py)
    N(_TM + "TokenizerManager._validate_one_request", H, E, ("self", "obj", "input_ids")),
    N(_TM + "TokenizerManager", M, E),
    N(_TM + "TokenizerManager.model_config", R, E),
    N(_TM + "TokenizerManager.mm_processor", R, E),  # the input guard accepts its placeholder ids
    N(_S + "managers.io_struct.GenerateReqInput.input_embeds", R, E),
    N(_S + "managers.io_struct.GenerateReqInput.return_logprob", R, E),
    N(_S + "managers.io_struct.GenerateReqInput.top_logprobs_num", R, E),
    N(_S + "managers.io_struct.GenerateReqInput.return_hidden_states", R, E),
    # --- every mode: failure report (failure_report.py)
    N(_S + "utils.watchdog.SubprocessWatchdog.start", H, E, ("self",)),
    N(_S + "utils.watchdog.SubprocessWatchdog._processes", R, E),
    N(_TM + "SignalHandler.running_phase_sigquit_handler", H, E, ("self",)),
    N(_TM + "SignalHandler.tokenizer_manager", R, E),
    N(_TM + "TokenizerManager._handle_abort_req", C, E, ("self", "recv_obj")),
    N(_TM + "TokenizerManager.rid_to_state", R, E),
    N(_TM + "TokenizerManager.event_loop", R, E),
    N(_S + "managers.io_struct.AbortReq", C, E, ("rid",)),
    N(_S + "managers.io_struct.AbortReq.finished_reason", R, E),
    # --- every mode: a scheduler that stopped after an error exits at once (rank_exit.py)
    N(_SCHED + "run_event_loop", H, E, ("self",)),
    N(_S + "utils.stale_shm_cleanup._SHM_DIR", R, E),
    N(_S + "utils.stale_shm_cleanup._creator_pid", C, E, ("filename",)),
    # --- stock pipeline: watchdog (stock_loop_watchdog.py), trace (stock_trace.py), dcpp (dcpp.py)
    N(_SCHED + "ingest_requests", H, WD, ("self",)),
    N(_SCHED + "run_batch", H, TR, ("self", "batch")),
    N(_SCHED + "on_idle", H, TR, ("self",)),
    N(_BATCH + "forward_mode", R, TR),
    N(_BATCH + "extend_num_tokens", R, TR),
    N(_BATCH + "forward_iter", R, TR),
    N(_BATCH + "reqs", R, TR),
    N(_S + "managers.scheduler_components.dynamic_chunk_sizer.DynamicChunkSizer.profile_and_fit", H, DC, ("self",)),
    # --- generic CPU platform (cpu_compat.py)
    N(_S + "platforms.current_platform", R, CPU),
    N(_S + "platforms.interface.SRTPlatform", R, CPU),
    N(_S + "layers.rotary_embedding.base", M, CPU),
    N(_S + "layers.rotary_embedding.base._is_cpu", W, CPU),
    N(_S + "layers.rotary_embedding.base.RotaryEmbedding.__init__",
      H, CPU, ("self", "head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style")),
    N(_S + "models.deepseek_v2.DeepseekV2AttentionMLA.dispatch_attn_forward_method", H, CPU, ("self", "forward_batch")),
    N(_S + "models.deepseek_common.attention_backend_handler._dispatch_mla_subtype", C, CPU, ("attn", "forward_batch")),
    # --- prefill-decode split (cpu_compat's sender guard, pd_guard's bootstrap check)
    N(_S + "disaggregation.mooncake.conn.MooncakeKVSender.__init__", H, CPD,
      ("self", "mgr", "bootstrap_addr", "bootstrap_room")),
    N(_S + "disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices", W, CPD),
    N(_ARGS + "disaggregation_mode", R, PD),
    N(_ARGS + "page_size", R, PD),
    N(_ARGS + "disaggregation_decode_retraction_backup", W, PD),
    N(_ARGS + "disable_overlap_schedule", W, PD),
    N(_S + "disaggregation.utils.FAKE_BOOTSTRAP_HOST", R, PD),
    # a VPP prefill's refusal of another attention TP, told to the decode side's guard (pd_guard.py)
    N(_S + "disaggregation.common.conn.CommonKVBootstrapServer._setup_routes", H, PD, ("self",)),
    N(_S + "disaggregation.common.conn.CommonKVBootstrapServer.app", R, PD),
    N(_S + "disaggregation.common.conn.CommonKVBootstrapServer.attn_tp_size", R, PD),
    N(_S + "runtime_context.get_server_args", C, PD),
    N(_S + "runtime_context.derive_attn_tp_size", C, PD),
    N(_ARGS + "disaggregation_transfer_backend", R, PD),
    N(_ARGS + "tp_size", R, PD),
    N(_ARGS + "attn_cp_size", R, PD),
    N(_ARGS + "attn_dp_size", R, PD),
    N(_S + "configs.model_config.ModelConfig.attention_arch", R, PD),
    N(_S + "configs.model_config.AttentionArch.MLA", R, PD),
    # --- decode side of a split: an incompatible prefill server fails its requests (pd_decode_refusal.py)
    N(_S + "disaggregation.decode.DecodePreallocQueue._ensure_prefill_info", H, PD, ("self", "addr_to_reqs")),
    N(_S + "disaggregation.decode.DecodePreallocQueue.kv_manager", R, PD),
    N(_S + "disaggregation.decode.DecodeRequest.req", R, PD),
    N(_S + "disaggregation.decode.DecodeRequest.kv_receiver", R, PD),
    N(_S + "disaggregation.common.conn.CommonKVReceiver.abort", C, PD, ("self",)),
    N(_S + "disaggregation.common.conn.CommonKVManager.record_failure", C, PD, ("self", "bootstrap_room", "failure_reason")),
    # which process of a group sharing requests tells the prefill server (pd_decode_refusal._tells_prefill)
    N(_S + "disaggregation.common.conn.CommonKVManager.pp_rank", R, PD),
    N(_S + "disaggregation.common.conn.CommonKVManager.attn_tp_rank", R, PD),
    N(_S + "disaggregation.common.conn.CommonKVManager.attn_cp_rank", R, PD),
    N(_REQ + "bootstrap_room", R, PD),  # vpp/pd_prefill.py reads it too
    N(_REQ + "bootstrap_host", R, VPD),  # a health check's or warm-up's is FAKE_BOOTSTRAP_HOST
    # --- the decode side's refusal ends the request on its prefill server too (pd_drop.py; the
    # bootstrap server's app, declared above, takes its POST route)
    N(_S + "managers.io_struct.GenerateReqInput.bootstrap_room", R, PD),
    N(_TM + "TokenizerManager.abort_request", C, PD, ("self", "rid")),
    N(_TM + "ReqState.obj", R, PD),
    N(_TM + "ReqState.finished", R, PD),
    N(_TM + "ReqState.dispatched", R, PD),
    # --- prefill-decode split, stock pp > 1 prefill: aborts in chunked prefill (pd_abort.py)
    N(_SCHED + "process_prefill_chunk", H, PD, ("self", "last_batch", "running_batch")),
    N(_SCHED + "process_pending_chunked_abort", C, PD, ("self",)),
    N(_TM + "TokenizerManager.server_args", R, E),  # the input guard reads pp_size and whether it serves a split
    # --- PD: KV layers registered and paired by global layer id (pd_layers.py)
    N(_S + "disaggregation.utils.build_kv_layer_ids", H, PD, ("token_to_kv_pool", "draft_token_to_kv_pool")),
    N(_S + "disaggregation.utils.build_transfer_entry_pairs",
      C, PD, ("src_layer_ids", "dst_layer_ids", "n_src", "n_dst", "allow_positional_fallback")),
    N(_S + "mem_cache.memory_pool.MHATokenToKVPool.get_contiguous_buf_infos", H, PD, ("self",)),
    N(_S + "mem_cache.memory_pool.MLATokenToKVPool.get_contiguous_buf_infos", H, PD, ("self",)),
    N(_S + "mem_cache.memory_pool.MHATokenToKVPool.start_layer", R, PD),
    N(_S + "mem_cache.memory_pool.MHATokenToKVPool.layer_num", R, PD),
    N(_S + "mem_cache.memory_pool.MLATokenToKVPool.start_layer", R, PD),
    # the MLA infos are computed on the owned latents alone: both set for that call, then restored
    N(_S + "mem_cache.memory_pool.MLATokenToKVPool.layer_num", W, PD),
    N(_S + "mem_cache.memory_pool.MLATokenToKVPool.kv_buffer", W, PD),
    N(_S + "disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache",
      H, PD, ("self", "mooncake_session_id", "prefill_kv_indices", "dst_kv_ptrs")),
    N(_S + "disaggregation.mooncake.conn.MooncakeKVManager.kv_args", R, PD),
    N(_S + "disaggregation.mooncake.conn.MooncakeKVManager.pp_size", R, PD),
    # --- VPP as a PD prefill server (vpp/pd_prefill.py)
    N(_S + "disaggregation.utils.poll_and_all_reduce_prefill_pp", H, VPD, ("pollers",)),
    N(_S + "disaggregation.prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk",
      H, VPD, ("self", "req", "last_chunk", "end_idx")),
    # refused on --device cpu: a decode server at another attention TP (the head-sliced path)
    N(_S + "disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache_slice", H, VPD,
      ("self", "mooncake_session_id", "prefill_kv_indices", "dst_kv_ptrs", "dst_kv_indices", "dst_tp_rank",
       "dst_attn_tp_size")),
    N(_S + "disaggregation.mooncake.conn.MooncakeKVManager.attn_tp_size", R, VPD),
    N(_S + "disaggregation.utils.DisaggregationMode.PREFILL", R, VPD),
    N(_S + "disaggregation.base.conn.KVPoll.Success", R, VPD),
    N(_S + "disaggregation.base.conn.KVPoll.Failed", R, VPD),
    N(_S + "disaggregation.base.conn.KVPoll.Bootstrapping", R, VPD),
    N(_S + "disaggregation.common.conn.CommonKVSender.poll_pp_consensus", C, VPD, ("self",)),
    N(_S + "disaggregation.common.conn.CommonKVSender.kv_mgr", R, VPD),
    N(_S + "disaggregation.common.conn.CommonKVSender.poll", C, VPD, ("self",)),
    N(_S + "disaggregation.common.conn.CommonKVManager.request_status", R, VPD),
    N(_S + "disaggregation.pp_consensus_store.PPConsensusStore.collect", C, VPD, ("self", "key")),
    N(_S + "disaggregation.prefill.PrefillBootstrapQueue.queue", R, VPD),
    N(_SCHED + "disaggregation_mode", R, VPD),
    N(_SCHED + "disagg_prefill_bootstrap_queue", R, VPD),
    N(_SCHED + "disagg_prefill_inflight_queue", R, VPD),
    N(_SCHED + "process_prefill_chunk", C, VPD, ("self", "last_batch", "running_batch")),
    N(_SCHED + "get_new_batch_prefill", C, VPD, ("self", "running_batch")),
    N(_SCHED + "process_bootstrapped_queue", C, VPD, ("self",)),
    N(_SCHED + "process_disagg_prefill_inflight_queue", C, VPD, ("self", "rids_to_check")),
    N(_SCHED + "send_kv_chunk", C, VPD, ("self", "req", "last_chunk", "end_idx")),
    N(_SCHED + "_pp_process_batch_result", C, VPD, ("self", "batch")),
    N(_BATCH + "extend_lens", R, VPD),
    N(_BATCH + "prefix_lens", R, VPD),
    N(_REQ + "inflight_middle_chunks", R, VPD),
    N(_REQ + "disagg_kv_sender", R, VPD),
    N(_REQ + "pending_bootstrap", R, VPD),
    N(_REQ + "metadata_buffer_index", R, VPD),
    # --- VPP: layer ownership, KV pools, model checks (vpp/ownership.py, vpp/__init__.py)
    N(_PS + "initialize_model_parallel", H, V),
    N(_PS + "_PP", R, V),
    N(_PS + "get_tp_group", C, V),
    N(_PS + "get_world_group", C, V),
    N(_PS + "GroupCoordinator", SW, V, ("is_first_rank", "is_last_rank")),
    N(_GROUP + "world_size", R, V),
    N(_GROUP + "rank_in_group", R, V),
    N(_GROUP + "ranks", R, V),
    N(_GROUP + "device", R, V),
    N(_GROUP + "cpu_group", R, V),
    N(_S + "distributed.utils.get_pp_indices", H, V, ("num_hidden_layers", "pp_rank", "pp_size")),
    N(_S + "utils.common.make_layers", H, V, ("num_hidden_layers", "layer_fn", "pp_rank", "pp_size")),
    N(_S + "layers.utils.PPMissingLayer", C, V),
    N(_S + "layers.utils.get_layer_id", C, V, ("weight_name",)),
    N(_S + "model_loader.loader.DefaultModelLoader._get_all_weights", H, V, ("self", "model_config", "model")),
    N(_S + "model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
      H, V, ("self", "kvc", "num_layers")),
    N(_S + "mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal", H, V, ("self",)),
    N(_S + "mem_cache.memory_pool.MLATokenToKVPool._create_buffers", H, V, ("self",)),
    N(_S + "model_executor.model_runner.ModelRunner.load_model", H, V, ("self",)),
    N(_S + "model_executor.model_runner.ModelRunner.alloc_memory_pool", H, V, ("self",)),
    N(_S + "model_executor.model_runner.ModelRunner.token_to_kv_pool", R, V),
    # graph capture off (validate.turn_graph_capture_off; the resolved setting checked in
    # ownership.after_load_model, before any capture)
    N(_ARGS + "cuda_graph_backend_decode", W, V),
    N(_ARGS + "cuda_graph_backend_prefill", W, V),
    N(_ARGS + "cuda_graph_config", R, V),
    N(_ARGS + "enable_torch_compile", R, V),
    N(_S + "model_executor.cuda_graph_config.check_cuda_graph_backend", C, V, ("phase", "backend")),
    N(_S + "runtime_context.get_flags", C, V),
    N(_S + "runtime_context.Flags.capture", R, V),
    N(_S + "runtime_context.CaptureFlags.enable_torch_compile", R, V),
    N(_S + "model_executor.model_runner.ModelRunner.model", R, V),
    # a DSA model refused at launch and before its pool (vpp/sparse_attention.py)
    N(_S + "configs.model_config.is_deepseek_dsa", C, V, ("config",)),
    N(_S + "model_executor.model_runner.ModelRunner.model_config", R, V),
    N(_S + "configs.model_config.ModelConfig.hf_config", R, V),
    N(_S + "model_executor.model_runner.ModelRunner.is_draft_worker", R, V),
    # --- VPP: the event loop, replicated schedulers, stage runs (vpp/event_loop.py, replica.py,
    # stage_runner.py): the loop sets up the slot state SGLang's init_pp_loop_state would
    N(_S + "managers.scheduler._dispatch_event_loop_once", H, V, ("scheduler",)),
    N(_S + "utils.DynamicGradMode", C, V),
    N(_SCHED + "ingest_requests", C, V, ("self",)),
    N(_SCHED + "process_input_requests", C, V, ("self", "recv_reqs")),
    N(_SCHED + "get_next_batch_to_run", C, V, ("self", "running_batch", "last_batch")),
    N(_SCHED + "run_batch", C, V, ("self", "batch", "pp_proxy_tensors")),
    N(_SCHED + "on_idle", C, V, ("self",)),
    N(_SCHED + "_pp_prepare_tensor_dict", C, V, ("self", "result", "batch")),
    N(_SCHED + "_pp_prep_batch_result", C, V, ("self", "batch", "mb_metadata", "pp_outputs")),
    N(_SCHED + "_pp_process_batch_result", C, V, ("self", "batch")),
    N(_SCHED + "init_pp_loop_state", R, V),  # the state below is what it sets up
    N(_SCHED + "pp_loop_size", W, V),
    N(_SCHED + "mbs", W, V),
    N(_SCHED + "last_mbs", W, V),
    N(_SCHED + "running_mbs", W, V),
    N(_SCHED + "mb_metadata", W, V),
    N(_SCHED + "pp_outputs", W, V),
    N(_SCHED + "_pp_spec_relay", W, V),
    N(_SCHED + "running_batch", W, V),
    N(_SCHED + "last_batch", W, V),
    N(_SCHED + "cur_batch_for_debug", W, V),
    N(_SCHED + "forward_ct", W, V),
    N(_SCHED + "_sched_idled", W, V),
    N(_SCHED + "_engine_paused", R, V),
    N(_SCHED + "gracefully_exit", R, V),
    N(_SCHED + "chunked_req", R, V),
    N(_SCHED + "max_total_num_tokens", R, V),
    N(_SCHED + "max_running_requests", R, V),
    N(_SCHED + "chunked_prefill_size", R, V),
    N(_SCHED + "page_size", R, V),
    N(_SCHED + "tp_worker", R, V),
    N(_SCHED + "model_worker", R, V),
    N(_SCHED + "future_map", R, V),
    N(_SCHED + "dynamic_chunk_sizer", W, V),  # vpp/chunk_sizing.py: the controller's chunk sizes
    N(_S + "managers.tp_worker.TpModelWorker.forward_batch_generation",
      C, V, ("self", "batch", "forward_batch", "pp_proxy_tensors")),
    N(_S + "managers.overlap_utils.resolve_forward_inputs", C, V, ("batch", "future_map")),
    N(_S + "model_executor.forward_batch_info.ForwardBatch.init_new", H, V, ("cls", "batch", "model_runner")),
    N(_S + "model_executor.forward_batch_info.ForwardBatch", M, V),
    N(_S + "model_executor.forward_batch_info.PPProxyTensors", C, V, ("tensors",)),
    N(_S + "managers.scheduler_pp_mixin.PPBatchMetadata", C, V, ("can_run_cuda_graph",)),
    N(_S + "managers.schedule_batch.ScheduleBatch", C, V, ("reqs",)),
    N(_BATCH + "batch_is_full", R, V),
    N(_BATCH + "forward_mode", R, V),
    N(_BATCH + "reqs", R, V),
    N(_BATCH + "extend_num_tokens", R, V),
    N(_BATCH + "prefix_lens", R, V),
    N(_BATCH + "seq_lens", R, V),
    N(_BATCH + "out_cache_loc", R, V),
    N(_BATCH + "forward_iter", W, V),
    N(_BATCH + "launch_ts", W, V),
    N(_BATCH + "after_idle_gap", W, V),
    N(_BATCH + "req_to_token_pool", R, V),
    N(_REQ + "rid", R, V),
    N(_REQ + "origin_input_ids", R, V),
    N(_REQ + "output_ids", R, V),
    N(_REQ + "prefix_len", R, V),
    N(_REQ + "to_finish", W, V),
    N(_REQ + "beam_group", R, V),
    # --- VPP: decode kept in the controller's decode slots (vpp/decode_slots.py)
    N(_BATCH + "filter_batch", C, V, ("self", "reqs_to_exclude")),
    N(_BATCH + "merge_batch", C, V, ("self", "other")),
    N(_BATCH + "batch_size", C, V),
    N(_BATCH + "is_empty", C, V),
    N(_BATCH + "chunked_req", R, V),
    N(_REQ + "finished", C, V),
    # A held slot's running batch: get_next_batch_to_run never decodes a prefill-only batch.
    N(_BATCH + "is_prefill_only", W, V),
    N(_REQ + "is_prefill_only", R, V),
    # --- VPP: chunk sizes, auto situations and retraction (vpp/chunk_sizing.py, vpp/retraction.py)
    N(_S + "managers.schedule_policy.PrefillAdder.add_one_req", H, V, ("self", "req")),
    N(_S + "managers.schedule_policy.PrefillAdder.rem_chunk_tokens", W, V),
    N(_S + "managers.schedule_policy.PrefillAdder.new_chunked_req", R, V),
    N(_S + "managers.schedule_policy.PrefillAdder.can_run_list", R, V),  # empty: a batch of new requests
    N(_SCHED + "waiting_queue", R, V),  # chunk_sizing.situation; pd_prefill.py
    N(_BATCH + "retract_decode", H, V, ("self",)),
    # --- VPP: constrained decoding's readiness decision on the event log (vpp/grammar_sync.py)
    N(_S + "constrained.grammar_manager.GrammarManager._pp_sync_ready_failed",
      H, V, ("self", "ready_req_idxs", "failed_req_idxs")),
    N(_SCHED + "grammar_manager", R, V),  # rank 0's loop does not go idle while a grammar compiles
    N(_S + "constrained.grammar_manager.GrammarManager.has_waiting_grammars", C, V, ("self",)),
    N(_S + "constrained.grammar_manager.GrammarManager.grammar_queue", R, V),  # rids a follower checks
    N(_S + "managers.scheduler_components.new_token_ratio_tracker.NewTokenRatioTracker."
      "estimate_new_token_ratio_after_retract", C, V, ("reqs",)),
    # --- serving/: bench_serving run in a warm worker (bench_worker.py), with a workload file
    # (file_load.py); the server launcher
    N("sglang.launch_server", M, SV),
    N("sglang.benchmark.serving", M, SV),
    N(_BENCH + "get_dataset", RP, SV, ("args", "tokenizer")),
    N(_BENCH + "get_request", RP, SV, ("input_requests", "request_rate")),
    N(_BENCH + "cli_main", C, SV),
    N(_BENCH + "DatasetRow", M, SV),
    N(_BENCH + "DatasetRow.timestamp", R, SV),
    N("sglang.benchmark.datasets.random", M, SV),
    N("sglang.benchmark.datasets.random.sample_random_requests",
      C, SV, ("input_len", "output_len", "num_prompts", "range_ratio", "tokenizer", "dataset_path",
              "random_sample", "return_text")),
)  # fmt: skip


def _refused_feature_fields() -> tuple[SurfaceName, ...]:
    """Every ``VPP_REFUSALS`` flag is a ServerArgs field the refusal reads."""
    from sglang_vpp.sglang_plugin.validate import VPP_REFUSALS

    return tuple(N(_ARGS + refusal.attr, R, V) for refusal in VPP_REFUSALS)


SURFACE = SURFACE + _refused_feature_fields()


def scopes_for(pp_mode: str, pp_size: int, trace: bool, generic_cpu: bool,
               disaggregation: str | None = None, device: str | None = None) -> tuple[Scope, ...]:
    """The scopes a server with these settings relies on (``disaggregation``: SGLang's
    ``--disaggregation-mode``, None or "null" without a split)."""
    from sglang_vpp.sglang_plugin.options import PpMode, is_vpp_mode

    scopes = [Scope.EVERY_MODE]
    if disaggregation not in (None, "null"):
        scopes.append(Scope.PD)
        if disaggregation == "prefill" and device == "cpu":
            scopes.append(Scope.CPU_PD)
    if generic_cpu:
        scopes.append(Scope.GENERIC_CPU)
    if is_vpp_mode(pp_mode):
        scopes.append(Scope.VPP)
        if disaggregation == "prefill":
            scopes.append(Scope.VPP_PD)
    else:
        if pp_mode == PpMode.DCPP:
            scopes.append(Scope.DCPP)
        if trace:
            scopes.append(Scope.STOCK_TRACE)
        if pp_size > 1:
            scopes.append(Scope.STOCK_WATCHDOG)
    return tuple(scopes)


def find_problems(scopes: tuple[Scope, ...]) -> list[str]:
    """One line per declared name of ``scopes`` that the installed SGLang lacks or changed."""
    problems = [problem_of(name) for name in SURFACE if name.scope in scopes]
    return [problem for problem in dict.fromkeys(problems) if problem is not None]


def refusal(mode: str, problems: list[str]) -> str:
    """The one start-up line naming every problem."""
    from sglang_vpp.sglang_plugin.version import SUPPORTED_SGLANG_VERSION

    return (
        f"--pp-mode {mode} cannot hook this SGLang: {'; '.join(problems)}. Install "
        f"sglang=={SUPPORTED_SGLANG_VERSION}, whose names the plugin declares ('sglang-vpp doctor "
        "--sglang' lists them), or use --pp-mode cpp without the sglang-vpp plugin installed"
    )


def problem_of(name: SurfaceName) -> str | None:
    """Why ``name`` does not hold on the installed SGLang, or None."""
    try:
        owner, attr, value = _resolve(name.path)
    except (ImportError, AttributeError, ValueError) as exc:
        return f"{name.path} is missing ({exc})"
    if name.use in (Use.HOOK, Use.CALL, Use.REPLACE) and name.params:
        return _signature_problem(name, value)
    if name.use is Use.SWAP:
        lost = [attr_ for attr_ in name.params if not hasattr(value, attr_)]
        return f"{name.path} has no {', '.join(lost)} to override" if lost else None
    return None


def _signature_problem(name: SurfaceName, value: Any) -> str | None:
    function = getattr(value, "__func__", value)
    try:
        params = tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return f"{name.path} has no readable signature"
    if isinstance(function, type) and params[:1] == ("self",):
        params = params[1:]
    if params[: len(name.params)] != name.params:
        return f"{name.path} takes ({', '.join(params)}), the plugin needs ({', '.join(name.params)}, ...)"
    return None


_ABSENT = object()


def _resolve(path: str) -> tuple[Any, str, Any]:
    """(owner, attribute name, raw value) of ``path``; AttributeError when absent. An instance
    attribute of a class (assigned on ``self`` in the class's code) resolves to ``None``."""
    try:
        return None, "", pkgutil.resolve_name(path)  # a module, or a plain module attribute
    except (ImportError, AttributeError, ValueError):
        pass
    owner_path, attr = path.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if not isinstance(owner, type):
        raise AttributeError(f"{owner_path} has no attribute {attr!r}")
    for klass in owner.__mro__:
        if attr in klass.__dict__:
            return owner, attr, klass.__dict__[attr]
    fields = set(getattr(owner, "__struct_fields__", ())) | set(getattr(owner, "__dataclass_fields__", {}))
    if attr in fields or any(attr in _self_attributes(klass) for klass in owner.__mro__):
        return owner, attr, None
    raise AttributeError(f"{owner_path} has no attribute {attr!r}")


@functools.lru_cache(maxsize=None)
def _self_attributes(klass: type) -> frozenset[str]:
    """Names the class's own code assigns on ``self`` (its instance attributes)."""
    if klass.__module__ == "builtins":
        return frozenset()
    try:
        filename = inspect.getsourcefile(klass)
    except TypeError:  # no source file: a built-in class, or one of a C extension
        return frozenset()
    if not filename:
        return frozenset()
    module = sys.modules.get(klass.__module__)
    by_class = _self_attributes_by_class(filename, module.__dict__ if module is not None else None)
    return by_class.get(klass.__qualname__, frozenset())


_BY_FILE: dict[str, dict[str, frozenset[str]]] = {}

CACHE_FORMAT = 2
"""Version of the on-disk cache of ``_self_attributes_by_class`` (``_cache_path``)."""

CACHE_MAX_ENTRIES = 256
"""Files the on-disk cache keeps, the most recently written: about ten times what one SGLang
install's start-up checks read, so several venvs or versions side by side each keep theirs."""

_ON_DISK: dict[Path, dict] = {}
"""Cache path -> its entries as this process read them (once) and wrote them since."""


def _self_attributes_by_class(filename: str, module_globals: dict | None) -> dict[str, frozenset[str]]:
    """Qualified name -> ``_self_attributes`` of every class defined in ``filename`` (the first
    definition of a name, the one ``inspect.getsource`` returns), from one parse of the file, or
    from the on-disk cache for that file's contents (their SHA-256).

    The launcher and every scheduler process run this check at start-up on a dozen classes
    (Scheduler and its mixins, TokenizerManager, ...) of files thousands of lines long; parsing
    them in each process (``inspect.getsource`` parses the whole file once per class) costs one
    to two seconds per process on every server start."""
    if filename in _BY_FILE:
        return _BY_FILE[filename]
    # Keyed by the contents, not size and mtime (a same-size rewrite may keep its mtime), and
    # parsed from the same bytes, which linecache's size-and-mtime check would not reread.
    try:
        with open(filename, "rb") as source:
            text: bytes | str = source.read()
        key = {"sha256": hashlib.sha256(text).hexdigest()}
    except OSError:  # source served by a loader, not a file: nothing to key a cache entry on
        text, key = "".join(linecache.getlines(filename, module_globals)), None
    cached = _cached_entry(filename, key)
    if cached is not None:
        _BY_FILE[filename] = cached
        return cached
    try:
        tree = ast.parse(text, filename) if text else None
    except (SyntaxError, ValueError):
        tree = None
    found: dict[str, frozenset[str]] = {}

    def visit(node: ast.AST, path: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):  # no class statement inside an expression
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, (*path, child.name, "<locals>"))
            elif isinstance(child, ast.ClassDef):
                found.setdefault(".".join((*path, child.name)), _assigned_on_self(child))
                visit(child, (*path, child.name))
            else:
                visit(child, path)

    if tree is not None:
        visit(tree, ())
        if key is not None:
            _store_entry(filename, key, found)
    _BY_FILE[filename] = found
    return found


def _cache_path():
    from sglang_vpp.models.tiny_hf import cache_dir

    return cache_dir() / "surface" / f"self-attributes-py{sys.version_info[0]}{sys.version_info[1]}.json"


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("format") == CACHE_FORMAT else None
    return files if isinstance(files, dict) else {}


def _cached_entry(filename: str, key: dict | None) -> dict[str, frozenset[str]] | None:
    """The cached classes of ``filename`` if recorded for these contents."""
    if key is None:
        return None
    path = _cache_path()
    if path not in _ON_DISK:
        _ON_DISK[path] = _read_cache(path)
    entry = _ON_DISK[path].get(filename)
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("classes"), dict):
        return None
    if not all(isinstance(attrs, list) for attrs in entry["classes"].values()):
        return None
    return {name: frozenset(attrs) for name, attrs in entry["classes"].items()}


def _store_entry(filename: str, key: dict, classes: dict[str, frozenset[str]]) -> None:
    """Record ``filename``'s classes (best effort: an unwritable cache only costs the parse).

    The entries kept are the newest ``CACHE_MAX_ENTRIES`` whose files still exist: those of a
    removed venv, SGLang version or file go, so the cache stays small however many come and go."""
    tmp = None
    try:
        path = _cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        files = _read_cache(path)  # read again: another process may have written since
        files.pop(filename, None)  # re-inserted last, the newest
        files[filename] = {"key": key, "classes": {name: sorted(attrs) for name, attrs in classes.items()}}
        kept = [name for name in files if os.path.exists(name)][-CACHE_MAX_ENTRIES:]
        files = {name: files[name] for name in kept}
        _ON_DISK[path] = files
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump({"format": CACHE_FORMAT, "files": files}, out)
        os.replace(tmp, path)  # whole files only: processes that start together may all write
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _assigned_on_self(node: ast.ClassDef) -> frozenset[str]:
    return frozenset(
        child.attr for child in ast.walk(node)
        if isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Store)
        and isinstance(child.value, ast.Name) and child.value.id == "self"
    )
