"""Validate ``--pp-mode`` / ``--vpp-*`` against the rest of SGLang's flags, before any model loads.

Data flow: the launcher's argparse Namespace (raw SGLang flags plus ours) and the parsed
PipelineOptions -> ``validate_pipeline_args`` -> raises PpModeError (a ValueError) with the bad
value and the fix, or returns. It reads the model's ``config.json`` only to count layers for
``--vpp-layer-split``; nothing else touches disk. ``cli_args`` turns the error into one line on
stderr and exit status 2, like argparse itself.

The checks implement the refusals listed in docs/sglang-vpp.md: VPP needs a pipeline
(pp size >= 2), fixed-size chunked prefill, and none of the features in ``VPP_REFUSALS``
(the one list; ``vpp.install`` checks it again in each scheduler process).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

from sglang_vpp.schedule import Fold, stage_count
from sglang_vpp.sglang_plugin.errors import PpModeError
from sglang_vpp.sglang_plugin.options import PipelineOptions, PpMode, is_vpp_mode, layer_split_count_error

__all__ = ["GRAPH_BACKEND_FLAGS", "local_model_config", "SCHEDULER_OPTIONS", "VPP_REFUSALS", "Refusal", "check_vpp_features", "model_num_layers",
           "chunked_prefill_refusal", "refuse_graph_capture", "turn_graph_capture_off", "validate_pipeline_args"]


def _get(args: Any, name: str, default: Any = None) -> Any:
    value = getattr(args, name, default)
    return default if value is None else value


def local_model_config(model_path: str | None, trust_remote_code: bool = False) -> dict[str, Any] | None:
    """The model's config as a dict, or None when it cannot be read locally (never downloaded)."""
    if not model_path:
        return None
    config_file = Path(model_path) / "config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text())
        return config if isinstance(config, dict) else None
    if os.path.isabs(model_path) or os.path.exists(model_path):
        return None  # a local path without config.json: SGLang itself reports it
    try:  # a hub id already in the local cache
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_path, local_files_only=True,
                                          trust_remote_code=trust_remote_code).to_dict()
    except Exception:  # noqa: BLE001 - unknown layout: vpp.install checks at start-up
        return None


def model_num_layers(model_path: str | None, trust_remote_code: bool = False) -> int | None:
    """Decoder layer count from the model's config, or None when it cannot be read locally."""
    config = local_model_config(model_path, trust_remote_code)
    if config is None:
        return None
    for section in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        for key in ("num_hidden_layers", "num_layers", "n_layer"):
            if isinstance(section.get(key), int):
                return section[key]
    return None


@dataclass(frozen=True, slots=True)
class Refusal:
    """One SGLang feature the VPP modes refuse, and why (listed in docs/sglang-vpp.md)."""

    attr: str
    """``ServerArgs`` attribute."""
    flag: str
    """The flag the user passed, as named in the message."""
    is_on: Callable[[Any], bool]
    reason: str
    fix: str = ""
    """What to do instead; empty: drop the flag or use a stock mode."""

    def advice(self) -> str:
        return self.fix or _drop_or_stock(self.flag)


def _drop_or_stock(flag: str) -> str:
    return f"Drop {flag}, or use --pp-mode cpp / dcpp"


def _truthy(value: Any) -> bool:
    return bool(value)


def _above_one(value: Any) -> bool:
    return int(value) > 1


def _above_zero(value: Any) -> bool:
    return int(value) > 0


def _is_set(value: Any) -> bool:
    return True


_PLACEHOLDERS = "its code paths touch the layers a rank does not own under fold-back placement"
_WHOLE_POOL = ("its KV pool allocates every layer of the rank's range, while the plugin allocates only the owned "
               "layers of SGLang's MHA and MLA pools and sizes the memory for those")
_OWN_POOL_DTYPES = ("mxfp8", "nvfp4", "fp4_mx_block16")
"""KV cache dtypes whose pools allocate through their own code (quantized MHA, FP4 MLA, MXFP8)."""
VPP_REFUSALS: tuple[Refusal, ...] = (
    Refusal("speculative_algorithm", "--speculative-algorithm", _truthy,
            "the draft model and the verify step would need their own fold-back stages"),
    Refusal("enable_lora", "--enable-lora", _truthy, _PLACEHOLDERS),
    Refusal("lora_paths", "--lora-paths", _truthy, _PLACEHOLDERS),
    Refusal("dp_size", "--dp-size", _above_one,
            "data-parallel replicas each need their own replicated VPP schedulers"),
    Refusal("attn_dp_size", "--attn-dp-size", _above_one,
            "attention DP splits the batch inside a stage; the VPP loop hands one batch per micro-batch"),
    Refusal("enable_dp_attention", "--enable-dp-attention", _truthy,
            "attention DP splits the batch inside a stage; the VPP loop hands one batch per micro-batch"),
    Refusal("disaggregation_mode", "--disaggregation-mode", lambda v: v == "decode",
            "a decode server runs SGLang's decode loop, which the VPP loop does not replace; serve "
            "decode with --pp-mode cpp: a VPP prefill server pairs with it by layer id, see docs/pd.md",
            "Use --pp-mode cpp for the decode server"),
    Refusal("disaggregation_transfer_backend", "--disaggregation-transfer-backend", lambda v: v == "ascend",
            "the Ascend connector pairs KV layers by global id only for hybrid-MLA pools and by "
            "position otherwise, which cannot express a rank owning two layer ranges; use mooncake"),
    Refusal("enable_hierarchical_cache", "--enable-hierarchical-cache", _truthy, _PLACEHOLDERS),
    Refusal("enable_lmcache", "--enable-lmcache", _truthy, _PLACEHOLDERS),
    Refusal("enable_pdmux", "--enable-pdmux", _truthy,
            "PD multiplexing runs its own scheduling loop, not the VPP loop"),
    Refusal("enable_dynamic_chunking", "--enable-dynamic-chunking", _truthy,
            "VPP chunks are fixed-size; --pp-mode dcpp is the dynamic-chunk mode"),
    Refusal("pp_async_batch_depth", "--pp-async-batch-depth", _above_zero,
            "it buffers outputs in stock PP's loop, which VPP replaces; the controller sets how many "
            "micro-batches are in flight"),
    Refusal("enable_mixed_chunk", "--enable-mixed-chunk", _truthy,
            "a mixed batch runs decode requests inside a prefill chunk, which the controller counts "
            "as prefill tokens in admission, packing and cost estimates, and no test covers"),
    Refusal("kv_cache_dtype", "--kv-cache-dtype", lambda v: v in _OWN_POOL_DTYPES, _WHOLE_POOL),
    Refusal("device", "--device", lambda v: v == "npu", _WHOLE_POOL, "Use --pp-mode cpp / dcpp on Ascend"),
    Refusal("enable_eplb", "--enable-eplb", _truthy,
            "expert rebalancing reads and moves the experts of every layer of the rank's range, "
            "placeholders included, while a forward runs one stage's layers"),
    Refusal("is_embedding", "--is-embedding", _truthy,
            "an embedding result has no next tokens, which the VPP loop hands on from the last stage"),
    Refusal("enable_pd_role_switch", "--enable-pd-role-switch", _truthy,
            "a switch to the decode role runs SGLang's decode loop, which the VPP loop does not replace, "
            "and captures decode graphs", "Use --pp-mode cpp for a server that switches roles"),
    Refusal("prefill_delayer_queue_min_ratio", "--prefill-delayer-queue-min-ratio", _is_set,
            "its queue trigger fires on each rank's own clock (--prefill-delayer-max-delay-ms), so "
            "the ranks' replicated schedulers would decide differently"),
)  # fmt: skip
"""Every feature refused with ``--pp-mode vpp*``: the one list, checked by the launcher
(``validate_pipeline_args``) and again in each scheduler process (``vpp.install``)."""


_BUILDS = "SGLang's own batch building (get_next_batch_to_run, PrefillAdder) makes every VPP micro-batch"
_INGESTS = "SGLang's own ingest_requests takes every request into the VPP loop"
_SIZES = "read where SGLang sizes its pools and caches at start-up, before any loop runs"
_NO_LOOP = "SGLang dispatches --pp-size > 1 to its PP loop whatever it says, so stock PP ignores it too"
SCHEDULER_OPTIONS: dict[str, str] = {
    **dict.fromkeys((
        "abort_on_priority_when_disabled", "default_priority_value", "disable_priority_preemption",
        "enable_priority_scheduling", "priority_scheduling_preemption_threshold",
        "schedule_low_priority_values_first", "schedule_policy", "schedule_conservativeness",
        "max_running_requests", "max_prefill_tokens", "prefill_max_requests", "prefill_decode_interval",
        "prefill_decode_interval_min_bs", "min_free_slots_delay", "retraction_policy",
        "pp_max_micro_batch_size", "enable_prefill_delayer", "prefill_delayer_forward_passes_buckets",
        "prefill_delayer_max_delay_ms", "prefill_delayer_max_delay_passes",
        "prefill_delayer_token_usage_low_watermark", "prefill_delayer_wait_seconds_buckets",
    ), _BUILDS),
    **dict.fromkeys(("max_queued_requests", "scheduler_recv_interval"), _INGESTS),
    **dict.fromkeys((
        "c128_page_size", "page_size", "max_total_tokens", "mem_fraction_static", "mamba_full_memory_ratio",
        "max_mamba_cache_size", "swa_full_tokens_ratio", "_swa_full_tokens_ratio_explicitly_set",
        "disable_hybrid_swa_memory", "swa_prefix_tails", "disable_chunked_prefix_cache",
        "prefill_only_disable_kv_cache",
    ), _SIZES),
    "disable_overlap_schedule": _NO_LOOP,
    "num_continuous_decode_steps": "SGLang 0.5.23's scheduler never reads it",
    "chunked_prefill_size": "the controller's chunk budget (a non-positive value is refused)",
    "pp_size": "the fold-back layout's rank count",
    **{refusal.attr: "refused (VPP_REFUSALS)" for refusal in VPP_REFUSALS},
}  # fmt: skip
"""How the VPP loop treats each scheduler-relevant SGLang option (SGLang's ``schedule`` group
and its ``pp_*`` options): honoured (and why that holds) or refused. The VPP loop replaces
SGLang's PP loop, so an option only that loop reads would be silently ignored; a test fails on
an option of the installed SGLang that is missing here."""


def check_vpp_features(args: Any, mode: str, resolved: bool = False) -> None:
    """Raise PpModeError for the first refused feature that ``args`` turns on, or naming every
    refused flag this SGLang no longer has (a renamed flag would otherwise pass unrefused).
    ``resolved``: ``args`` are SGLang's resolved server arguments (a scheduler process), where a
    value may come from SGLang itself (the model's kind, the detected device), not a flag."""
    absent = [refusal.attr for refusal in VPP_REFUSALS if not hasattr(args, refusal.attr)]
    if absent:
        raise PpModeError(
            f"--pp-mode {mode} cannot check its refused features: this SGLang has no "
            f"{', '.join(absent)} in its arguments; install the SGLang version the plugin supports"
        )
    for refusal in VPP_REFUSALS:
        value = getattr(args, refusal.attr)
        if value is not None and refusal.is_on(value):
            source = " as SGLang resolved it for this model and machine" if resolved else ""
            raise PpModeError(
                f"--pp-mode {mode} does not support {refusal.flag} (got {value!r}{source}): {refusal.reason}. "
                f"{refusal.advice()}"
            )


def chunked_prefill_refusal(args: Any, mode: str, resolved: bool = False) -> str | None:
    """Why ``--pp-mode mode`` cannot run with ``args``'s ``chunked_prefill_size``, or None.

    dcpp and the vpp modes pipeline prefill chunks, so chunked prefill must be on. What SGLang
    0.5.23 hands over differs by when ``args`` are read:

    - the launcher's raw Namespace (``resolved`` False): None is an unset flag, which SGLang's
      argument resolution (``arg_groups.memory_hook.handle_gpu_memory_settings``) later turns into a
      positive size for the machine (4096 when it cannot read the device memory), so only a size
      the user gave that is <= 0 (SGLang's -1 disables chunking) is refused here;
    - SGLang's resolved arguments in a scheduler process (``resolved`` True): a model or feature
      hook may have resolved the size to -1, and SGLang's scheduler reads None and <= 0 alike as
      "no chunked prefill" (``Scheduler.init_chunked_prefill``), so both are refused.
    """
    value = getattr(args, "chunked_prefill_size", None)
    if value is None and not resolved:
        return None
    if value is not None and int(value) > 0:
        return None
    source = " as SGLang resolved it for this model and machine" if resolved else ""
    return (f"--pp-mode {mode} pipelines prefill chunks but chunked prefill is disabled "
            f"(--chunked-prefill-size {value}{source}); pass a positive --chunked-prefill-size, e.g. 4096, "
            "or use --pp-mode cpp")


GRAPH_BACKEND_FLAGS = {"cuda_graph_backend_decode": "--cuda-graph-backend-decode",
                       "cuda_graph_backend_prefill": "--cuda-graph-backend-prefill"}
"""SGLang's per-phase graph capture switches, which a vpp* mode sets to ``disabled``."""
_ONE_FORWARD_PER_STAGE = ("a captured graph replays the forward over the rank's whole layer range, while a VPP "
                          "rank runs each of its two stages as its own forward")


def _backend_captures(value: Any) -> bool:
    return value is not None and str(value) != "disabled"


_GRAPH_CAPTURE_FLAGS = (
    *((attr, flag, _backend_captures) for attr, flag in GRAPH_BACKEND_FLAGS.items()),
    ("cuda_graph_config", "--cuda-graph-config", bool),
    ("enable_torch_compile", "--enable-torch-compile", bool),
)
"""(attribute, flag, whether its value asks for a capture) of every flag that captures graphs."""


def refuse_graph_capture(args: Any, mode: str) -> None:
    """PpModeError for a graph capture the user asked for with a vpp* mode."""
    for attr, flag, captures in _GRAPH_CAPTURE_FLAGS:
        value = getattr(args, attr, None)
        if captures(value):
            raise PpModeError(f"--pp-mode {mode} does not support {flag} (got {value!r}): {_ONE_FORWARD_PER_STAGE}; "
                              f"the plugin turns graph capture off itself. {_drop_or_stock(flag)}")


def turn_graph_capture_off(args: Any) -> list[str]:
    """For a vpp* mode (launcher, before SGLang resolves its arguments; ``refuse_graph_capture``
    passed): switch both phases' graph capture off, which SGLang turns on by default for decode
    on every device but the CPU. Returns the flags it set, for the log."""
    set_now = []
    for attr, flag in GRAPH_BACKEND_FLAGS.items():
        if getattr(args, attr, None) is None:
            setattr(args, attr, "disabled")
            set_now.append(f"{flag} disabled")
    return set_now


def _check_vpp_compatible_features(args: Any, mode: str) -> None:
    check_vpp_features(args, mode)
    if os.environ.get("SGLANG_PP_LAYER_PARTITION"):
        raise PpModeError(
            f"--pp-mode {mode} takes its layer split from --vpp-layer-split, but "
            f"SGLANG_PP_LAYER_PARTITION={os.environ['SGLANG_PP_LAYER_PARTITION']!r} is set; "
            "unset it and pass --vpp-layer-split instead"
        )


def _check_layer_split(args: Any, options: PipelineOptions, pp_size: int) -> None:
    num_stages = stage_count("foldback", pp_size)  # the method's: an even split needs this many layers, fused or not
    num_layers = model_num_layers(_get(args, "model_path"), bool(_get(args, "trust_remote_code")))
    split = options.vpp_layer_split
    count_error = layer_split_count_error(split, pp_size, options.vpp_fold)
    if count_error is not None:
        raise PpModeError(count_error)
    if num_layers is None:
        return  # not readable here (remote model): vpp.install checks it at start-up
    if split is not None and sum(split) != num_layers:
        raise PpModeError(
            f"--vpp-layer-split {','.join(map(str, split))} covers {sum(split)} layers but the "
            f"model has {num_layers}; make the counts add up to {num_layers}"
        )
    if split is None and num_layers < num_stages:
        fix = "lower --pp-size"
        num_fused = stage_count("foldback", pp_size, Fold.FUSED)
        if num_layers == num_fused:  # a fused fold has a stage fewer: one layer each holds the model
            counts = ",".join("1" * num_fused)
            fix += f", or serve the {num_fused} virtual stages of a fused fold: --vpp-fold fused --vpp-layer-split {counts}"
        raise PpModeError(
            f"--pp-mode {options.pp_mode} with --pp-size {pp_size} needs at least {num_stages} "
            f"layers (2 virtual stages per rank) but the model has {num_layers}; {fix}"
        )


def validate_pipeline_args(args: Any, options: PipelineOptions) -> None:
    """Raise PpModeError for an invalid flag combination; see the module docstring."""
    mode = options.pp_mode
    pp_size = int(_get(args, "pp_size", 1))

    if not is_vpp_mode(mode) and options.vpp_fold is not Fold.SPLIT:
        raise PpModeError(
            f"--vpp-fold {options.vpp_fold} only applies to --pp-mode vpp, vpp-async, vpp-pack, vpp-taper or "
            f"vpp-stream (got --pp-mode {mode}); drop --vpp-fold or choose a vpp mode"
        )
    if not is_vpp_mode(mode) and options.vpp_layer_split is not None:
        raise PpModeError(
            f"--vpp-layer-split only applies to --pp-mode vpp, vpp-async, vpp-pack, vpp-taper or "
            f"vpp-stream (got --pp-mode {mode}); drop --vpp-layer-split or choose a vpp mode"
        )
    if mode == PpMode.CPP:
        return
    if pp_size < 2:
        raise PpModeError(
            f"--pp-mode {mode} needs pipeline parallelism but --pp-size is {pp_size}; "
            "pass --pp-size 2 (or more), or use --pp-mode cpp"
        )
    chunked_refusal = chunked_prefill_refusal(args, mode)
    if chunked_refusal:
        raise PpModeError(chunked_refusal)
    if mode == PpMode.DCPP:
        return
    _check_vpp_compatible_features(args, mode)
    refuse_graph_capture(args, mode)
    _check_layer_split(args, options, pp_size)
