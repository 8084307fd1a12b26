"""Per-process set-up in SGLang's scheduler processes: CPU compatibility and the VPP install.

Data flow (each scheduler process, one per PP rank x TP rank)::

    run_scheduler_process(server_args, ...)          (spawned; server_args unpickled with
      load_plugins() -> entry.register()               its _sglang_vpp options)
      publish(server_args, role="scheduler", ...)    [BEFORE hook: before_publish]
        -> setup_scheduler_process(server_args)
             check_options_reached(server_args)       (the launcher's --pp-mode arrived here)
             surface.find_problems(scopes)            (every declared name this mode relies on)
             register_cpu_hooks()                     (generic CPU platform only)
             rank_exit hook on run_event_loop         (every mode: a loop that raised exits
                                                       with code 0, before native teardown)
             register_cpu_pd_hooks()                  (--device cpu prefill servers only)
             register_pd_layer_hooks()                (PD servers: KV layers paired by id)
             vpp.install(server_args)                 (vpp* modes only; raises if missing)
             dcpp.install_dcpp_hooks()                (dcpp only: retry a rejected profile fit)
             stock_trace.install_stock_trace(dir)     (cpp / dcpp with --vpp-trace only)
             install_stock_loop_watchdog(timeout)     (cpp / dcpp with --pp-size > 1:
                                                       --vpp-comm-timeout on the stock loop)
             HookRegistry.apply_hooks()               (patches what was just registered)
             hook_targets.find_unapplied()            (vpp*: refuse if a hook did not take)
      Scheduler(server_args, ...)                    (distributed groups, model, KV pools)

``publish`` is the first call in the scheduler process that receives ``server_args`` after the
plugins are loaded, and it runs before the Scheduler exists, which is where VPP's hooks must be
in place. Other roles (detokenizer, DP controller, launcher) are left alone.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_vpp.sglang_plugin.errors import PluginError
from sglang_vpp.sglang_plugin.hook_targets import require_applied
from sglang_vpp.sglang_plugin.options import PpMode, check_options_reached, options_of

__all__ = ["PUBLISH_TARGET", "before_publish", "check_scheduler_surface", "setup_scheduler_process"]

logger = logging.getLogger(__name__)

PUBLISH_TARGET = "sglang.srt.runtime_context.publish"
_done_for: set[int] = set()


def setup_scheduler_process(server_args: Any) -> None:
    """Install CPU hooks and, for vpp* modes, the VPP hooks (or the stock-PP trace) here."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if id(server_args) in _done_for:
        return  # publish may run again for the same record (last-publish-wins)
    _done_for.add(id(server_args))
    from sglang_vpp.sglang_plugin.cpu_compat import (
        PD_SENDER_INIT_TARGET,
        is_generic_cpu_platform,
        register_cpu_hooks,
        register_cpu_pd_hooks,
    )

    check_options_reached(server_args)
    options = options_of(server_args)
    check_scheduler_surface(options, int(getattr(server_args, "pp_size", 1) or 1), is_generic_cpu_platform(),
                            server_args)
    register_cpu_hooks()
    from sglang_vpp.sglang_plugin.hook_targets import register_hook
    from sglang_vpp.sglang_plugin.rank_exit import RUN_EVENT_LOOP_TARGET, around_run_event_loop

    register_hook(RUN_EVENT_LOOP_TARGET, around_run_event_loop, HookType.AROUND)
    # hooks registered here that this process must not run without; without the quick exit a
    # survivor of a peer's death can abort in teardown and be reported as the failed rank
    required: list[str] = [RUN_EVENT_LOOP_TARGET]
    if register_cpu_pd_hooks(server_args):
        required.append(PD_SENDER_INIT_TARGET)
    from sglang_vpp.sglang_plugin.pd_layers import BUILD_IDS, register_pd_layer_hooks

    if register_pd_layer_hooks(server_args):
        required.append(BUILD_IDS)  # without it a VPP prefill's KV would pair by position
    from sglang_vpp.sglang_plugin.pd_decode_refusal import ENSURE_PREFILL_INFO_TARGET, install_decode_refusal_hook

    if install_decode_refusal_hook(server_args):
        required.append(ENSURE_PREFILL_INFO_TARGET)  # without it a mismatched prefill server ends this one
    if options.is_vpp:
        from sglang_vpp.sglang_plugin.vpp import install

        install(server_args)
        logger.info("sglang-vpp: installed --pp-mode %s in this scheduler", options.pp_mode)
    else:
        from sglang_vpp.sglang_plugin.pd_abort import PREFILL_CHUNK_TARGET, install_pd_abort_hook

        if options.pp_mode == PpMode.DCPP:
            from sglang_vpp.sglang_plugin.dcpp import install_dcpp_hooks

            install_dcpp_hooks()
        if options.vpp_trace:
            from sglang_vpp.sglang_plugin.stock_trace import install_stock_trace

            install_stock_trace(options.vpp_trace)
        if install_pd_abort_hook(server_args):
            required.append(PREFILL_CHUNK_TARGET)
        if int(getattr(server_args, "pp_size", 1)) > 1:
            from sglang_vpp.sglang_plugin.stock_loop_watchdog import (
                INGEST_TARGET,
                install_stock_loop_watchdog,
            )

            install_stock_loop_watchdog(options.vpp_comm_timeout)
            required.append(INGEST_TARGET)
    HookRegistry.apply_hooks()
    _check_hooks_applied(options)
    require_applied(*required)


def check_scheduler_surface(options: Any, pp_size: int, generic_cpu: bool, server_args: Any = None) -> None:
    """Raise (before the Scheduler exists) naming every SGLang name this process relies on that
    is missing or changed; VppConfigError in vpp modes, PluginError in stock ones."""
    from sglang_vpp.sglang_plugin.surface import find_problems, refusal, scopes_for

    problems = find_problems(scopes_for(options.pp_mode, pp_size, bool(options.vpp_trace), generic_cpu,
                                        getattr(server_args, "disaggregation_mode", None),
                                        getattr(server_args, "device", None)))
    if not problems:
        return
    if options.is_vpp:
        from sglang_vpp.sglang_plugin.vpp.errors import VppConfigError

        raise VppConfigError(refusal(options.pp_mode, problems))
    raise PluginError(refusal(options.pp_mode, problems))


def _check_hooks_applied(options: Any) -> None:
    """SGLang only logs a hook it could not apply: VPP refuses to run half-patched."""
    from sglang_vpp.sglang_plugin.hook_targets import find_unapplied
    from sglang_vpp.sglang_plugin.surface import Scope

    missing = find_unapplied(tuple(Scope))
    if not missing:
        return
    if options.is_vpp:
        from sglang_vpp.sglang_plugin.vpp.errors import VppConfigError

        raise VppConfigError(
            f"--pp-mode {options.pp_mode}: SGLang did not apply the plugin's hook on {', '.join(missing)} "
            "(see the 'Failed to apply hooks' line above); install the SGLang version the plugin supports, "
            "or use --pp-mode cpp"
        )
    logger.warning("sglang-vpp: SGLang did not apply the plugin's hook on %s", ", ".join(missing))


def before_publish(server_args: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``runtime_context.publish``; acts for ``role="scheduler"`` only."""
    if kwargs.get("role") == "scheduler":
        setup_scheduler_process(server_args)
    return None
