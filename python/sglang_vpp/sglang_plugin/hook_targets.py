"""Every SGLang function the plugin hooks (and the one a hook calls), in one list, and the checks
that they exist and took effect.

SGLang's ``HookRegistry.apply_hooks`` only logs a target it cannot patch, so a renamed function
would leave a VPP server running half-patched. Hence:

- ``HOOK_TARGETS`` names every target with the parameters its hook relies on (a prefix of the
  target's signature) and the modes that need it;
- ``register_hook`` is the plugin's only way to register a hook: it refuses a target missing from
  the list (so a hook added later is checked like the others) and remembers what the target was;
- ``find_target_problems`` resolves targets and checks their signatures before anything starts;
- ``find_unapplied`` runs after ``apply_hooks`` and names every registered target that is still
  the original function; ``require_applied`` raises on such a target whose hook no mode may run
  without (the input guard, the failure report, the stock-loop watchdog).

The VPP modes refuse to start on any problem (``vpp.check_args`` / ``process_hooks``); the stock
modes only log it.
"""

from __future__ import annotations

import inspect
import logging
import pkgutil
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable

logger = logging.getLogger(__name__)

__all__ = ["HookScope", "HookTarget", "HOOK_TARGETS", "register_hook", "find_target_problems", "find_unapplied",
           "require_applied"]


class HookScope(StrEnum):
    EVERY_MODE = "every-mode"  # argument parsing and the scheduler-process set-up
    GENERIC_CPU = "generic-cpu"  # only on SGLang's generic CPU platform
    CPU_PD = "cpu-pd"  # --device cpu with --disaggregation-mode prefill
    DCPP = "dcpp"
    STOCK_TRACE = "stock-trace"  # cpp / dcpp with --vpp-trace
    STOCK_WATCHDOG = "stock-watchdog"  # cpp / dcpp with --pp-size > 1 (--vpp-comm-timeout)
    VPP = "vpp"


@dataclass(frozen=True, slots=True)
class HookTarget:
    path: str
    """Dotted path under ``sglang``, as ``HookRegistry.register`` takes it."""
    params: tuple[str, ...]
    """Leading parameter names the hook relies on (positional order)."""
    scope: HookScope


_S = "sglang.srt."
HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget(_S + "server_args.ServerArgs.add_cli_args", ("parser",), HookScope.EVERY_MODE),
    HookTarget(_S + "server_args.ServerArgs.from_cli_args", ("cls", "args"), HookScope.EVERY_MODE),
    HookTarget(_S + "runtime_context.publish", ("server_args", "role"), HookScope.EVERY_MODE),
    HookTarget(_S + "managers.tokenizer_manager.TokenizerManager._validate_one_request",
               ("self", "obj", "input_ids"), HookScope.EVERY_MODE),
    HookTarget(_S + "utils.watchdog.SubprocessWatchdog.start", ("self",), HookScope.EVERY_MODE),
    HookTarget(_S + "managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler", ("self",),
               HookScope.EVERY_MODE),
    HookTarget(_S + "managers.scheduler.Scheduler.ingest_requests", ("self",), HookScope.STOCK_WATCHDOG),
    HookTarget(_S + "layers.rotary_embedding.base.RotaryEmbedding.__init__",
               ("self", "head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style"),
               HookScope.GENERIC_CPU),
    HookTarget(_S + "models.deepseek_v2.DeepseekV2AttentionMLA.dispatch_attn_forward_method",
               ("self", "forward_batch"), HookScope.GENERIC_CPU),
    HookTarget(_S + "disaggregation.mooncake.conn.MooncakeKVSender.__init__",
               ("self", "mgr", "bootstrap_addr", "bootstrap_room"), HookScope.CPU_PD),
    HookTarget(_S + "managers.scheduler_components.dynamic_chunk_sizer.DynamicChunkSizer.profile_and_fit",
               ("self",), HookScope.DCPP),
    HookTarget(_S + "managers.scheduler.Scheduler.run_batch", ("self", "batch"), HookScope.STOCK_TRACE),
    HookTarget(_S + "managers.scheduler.Scheduler.on_idle", ("self",), HookScope.STOCK_TRACE),
    HookTarget(_S + "distributed.parallel_state.initialize_model_parallel", (), HookScope.VPP),
    HookTarget(_S + "distributed.utils.get_pp_indices", ("num_hidden_layers", "pp_rank", "pp_size"), HookScope.VPP),
    HookTarget(_S + "utils.common.make_layers", ("num_hidden_layers", "layer_fn", "pp_rank", "pp_size"),
               HookScope.VPP),
    HookTarget(_S + "model_loader.loader.DefaultModelLoader._get_all_weights", ("self", "model_config", "model"),
               HookScope.VPP),
    HookTarget(_S + "model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
               ("self", "kvc", "num_layers"), HookScope.VPP),
    HookTarget(_S + "mem_cache.memory_pool.MHATokenToKVPool._create_buffers_normal", ("self",), HookScope.VPP),
    HookTarget(_S + "mem_cache.memory_pool.MLATokenToKVPool._create_buffers", ("self",), HookScope.VPP),
    HookTarget(_S + "model_executor.model_runner.ModelRunner.load_model", ("self",), HookScope.VPP),
    HookTarget(_S + "model_executor.forward_batch_info.ForwardBatch.init_new", ("cls", "batch", "model_runner"),
               HookScope.VPP),
    HookTarget(_S + "managers.scheduler._dispatch_event_loop_once", ("scheduler",), HookScope.VPP),
    HookTarget(_S + "managers.schedule_policy.PrefillAdder.add_one_req", ("self", "req"), HookScope.VPP),
    HookTarget(_S + "managers.schedule_batch.ScheduleBatch.retract_decode", ("self",), HookScope.VPP),
    # Not hooked: called by the retract_decode hook (vpp/retraction.py), so checked at start-up too.
    HookTarget(_S + "managers.scheduler_components.new_token_ratio_tracker.NewTokenRatioTracker."
               "estimate_new_token_ratio_after_retract", ("reqs",), HookScope.VPP),
)
_BY_PATH = {target.path: target for target in HOOK_TARGETS}

_registered: dict[str, Any] = {}
"""Target path -> the object it resolved to when its hook was registered (this process)."""


def register_hook(path: str, hook: Callable, hook_type: Any) -> None:
    """``HookRegistry.register`` for a listed target, remembering the original to verify later."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert path in _BY_PATH, f"hook target {path} is not in hook_targets.HOOK_TARGETS: add it there"
    if path not in _registered:
        _registered[path] = _resolve(path)
    HookRegistry.register(path, hook, hook_type)


def find_target_problems(scopes: tuple[HookScope, ...]) -> list[str]:
    """One line per target of ``scopes`` that is missing or whose signature changed."""
    problems = []
    for target in HOOK_TARGETS:
        if target.scope not in scopes:
            continue
        try:
            function = _resolve(target.path)
        except (ImportError, AttributeError, ValueError) as exc:
            problems.append(f"{target.path} is missing ({exc})")
            continue
        function = getattr(function, "__func__", function)
        try:
            names = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            problems.append(f"{target.path} has no readable signature")
            continue
        if names[: len(target.params)] != target.params:
            problems.append(f"{target.path} takes ({', '.join(names)}), the plugin needs ({', '.join(target.params)}, ...)")
    return problems


def find_unapplied(scopes: tuple[HookScope, ...]) -> list[str]:
    """Targets of ``scopes`` registered in this process that are still the original object."""
    return [
        path for path, original in _registered.items()
        if _BY_PATH[path].scope in scopes and _resolve(path) is original
    ]


def require_applied(*paths: str) -> None:
    """Raise PluginError naming every target in ``paths`` whose hook is not in place."""
    from sglang_vpp.sglang_plugin.errors import PluginError

    missing = [path for path in paths if path not in _registered or _resolve(path) is _registered[path]]
    if missing:
        raise PluginError(
            f"sglang-vpp could not hook {', '.join(missing)} (SGLang logged 'Failed to apply hooks' "
            "above?); this SGLang build does not match the plugin: install sglang==0.5.23"
        )


def _resolve(path: str) -> Any:
    """The raw object at ``path`` (for a class attribute its ``__dict__`` entry, so a
    classmethod or staticmethod is compared as the descriptor ``HookRegistry`` replaces)."""
    owner_path, name = path.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name]
        raise AttributeError(f"{owner_path} has no attribute {name!r}")
    return getattr(owner, name)
