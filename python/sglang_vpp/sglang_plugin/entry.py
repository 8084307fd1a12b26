"""Entry point of the ``sglang.srt.plugins`` group: registers the plugin's hooks.

SGLang's ``load_plugins()`` calls ``register()`` in the launcher (before argument parsing), in
every scheduler process, in the detokenizer and in the DP controller, then applies all
registered hooks. Hook targets, each a stable function of SGLang 0.5.23:

- ``sglang.srt.server_args.ServerArgs.add_cli_args`` (AFTER): add --pp-mode, --vpp-* flags
- ``sglang.srt.server_args.ServerArgs.from_cli_args`` (AROUND): dcpp switch; attach options
- ``sglang.srt.runtime_context.publish`` (BEFORE): scheduler set-up, vpp.install
- ``sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request`` (BEFORE):
  input guard, bad prompts answered 400 (``input_guard.py``; verified after parsing)
- ``sglang.srt.utils.watchdog.SubprocessWatchdog.start`` (BEFORE): remember the rank processes
- ``sglang.srt.managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler``
  (AROUND): one log line per failed rank, pending clients answered 503, then SGLang kills
  the tree (``failure_report.py``)

A version other than 0.5.23 raises SGLangVersionError here; SGLang logs it ("Failed to execute
general plugin") and continues as stock SGLang without ``--pp-mode``, so a vpp request then
fails at argument parsing ("unrecognized arguments: --pp-mode") instead of running stock PP.
"""

from __future__ import annotations

__all__ = ["register"]

_registered = False


def register() -> None:
    """Zero-argument plugin function (see module docstring). Idempotent."""
    global _registered
    if _registered:
        return
    from sglang_vpp.sglang_plugin.version import check_sglang_version

    check_sglang_version()

    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin import cli_args, failure_report, input_guard, process_hooks
    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook("sglang.srt.server_args.ServerArgs.add_cli_args", cli_args.after_add_cli_args, HookType.AFTER)
    register_hook("sglang.srt.server_args.ServerArgs.from_cli_args", cli_args.around_from_cli_args, HookType.AROUND)
    register_hook(process_hooks.PUBLISH_TARGET, process_hooks.before_publish, HookType.BEFORE)
    register_hook(input_guard.VALIDATE_REQUEST_TARGET, input_guard.check_request_tokens, HookType.BEFORE)
    register_hook(failure_report.WATCHDOG_START_TARGET, failure_report.remember_ranks, HookType.BEFORE)
    register_hook(failure_report.SIGQUIT_HANDLER_TARGET, failure_report.around_sigquit_handler, HookType.AROUND)
    _registered = True
