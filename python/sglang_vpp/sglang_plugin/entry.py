"""Entry point of the ``sglang.srt.plugins`` group: registers the plugin's hooks.

SGLang's ``load_plugins()`` calls ``register()`` in the launcher (before argument parsing), in
every scheduler process, in the detokenizer and in the DP controller, then applies all
registered hooks. Hook targets, each declared in ``surface.py`` (SGLang 0.5.23):

- ``sglang.srt.server_args.ServerArgs.add_cli_args`` (AFTER): add --pp-mode, --vpp-* flags
- ``sglang.srt.server_args.ServerArgs.from_cli_args`` (AROUND): dcpp switch; attach options
- ``sglang.srt.runtime_context.publish`` (BEFORE): scheduler set-up, vpp.install
- ``sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request`` (BEFORE):
  input guard, bad prompts answered 400 (``input_guard.py``; verified after parsing)
- ``sglang.srt.disaggregation.common.conn.CommonKVBootstrapServer._setup_routes`` (AFTER; a
  launcher started with ``--disaggregation-mode prefill`` only): its bootstrap server also says
  whether it refuses a decode server of another attention TP size (``pd_guard.py``) and takes a
  decode server's refusal of a room, ending that request at once (``pd_drop.py``)
- ``sglang.srt.utils.watchdog.SubprocessWatchdog.start`` (BEFORE): remember the rank processes
- ``sglang.srt.managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler``
  (AROUND): one log line per failed rank, pending clients answered 503, then SGLang kills
  the tree (``failure_report.py``)

[Note: loud failure] When the plugin cannot load (an SGLang version other than 0.5.23, or in the
launcher a missing or changed name among those the command line's mode relies on, see
``cli_args.scopes_of_argv``), it registers nothing and:

- a process started with a plugin flag (``cli_args.PLUGIN_FLAGS``), or a subprocess of a
  launcher that parsed one (``options.EXPECTED_MODE_ENV``), exits with status 2 and one line
  saying why, naming each missing or changed name (SGLang catches a plugin's exceptions and
  would continue as stock SGLang);
- any other launcher logs one warning line naming the protections that are off.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys

__all__ = ["PROTECTIONS_OFF", "cannot_load", "register"]

logger = logging.getLogger(__name__)

PROTECTIONS_OFF = (
    "the input guard (bad prompts crash the server), the failure report (which rank failed) and "
    "the stock-loop watchdog (--vpp-comm-timeout)"
)

_registered = False


def _load_problem(argv: list[str]) -> str | None:
    """Why the plugin cannot load in this process, or None."""
    from sglang_vpp.sglang_plugin.errors import SGLangVersionError
    from sglang_vpp.sglang_plugin.version import check_sglang_version

    try:
        check_sglang_version()
    except SGLangVersionError as exc:
        return str(exc)
    if multiprocessing.parent_process() is not None:
        return None  # a scheduler checks its own scopes before the Scheduler exists (process_hooks)
    from sglang_vpp.sglang_plugin.cli_args import scopes_of_argv
    from sglang_vpp.sglang_plugin.cpu_compat import is_generic_cpu_platform
    from sglang_vpp.sglang_plugin.surface import find_problems

    problems = find_problems(scopes_of_argv(argv, is_generic_cpu_platform()))
    return f"this SGLang lacks or changed {'; '.join(problems)}" if problems else None


def cannot_load(reason: str, argv: list[str]) -> None:
    """Exit (a plugin flag was given) or warn once (the launcher of a stock server)."""
    from sglang_vpp.sglang_plugin.cli_args import plugin_flags_in
    from sglang_vpp.sglang_plugin.options import EXPECTED_MODE_ENV

    wanted = plugin_flags_in(argv)
    if os.environ.get(EXPECTED_MODE_ENV):
        wanted.append(f"--pp-mode {os.environ[EXPECTED_MODE_ENV]} (from the launcher)")
    if wanted:
        print(f"sglang-vpp: error: the plugin cannot load, so {', '.join(wanted)} cannot be served: {reason}",
              file=sys.stderr)
        sys.exit(2)
    if multiprocessing.parent_process() is None:
        logger.warning("sglang-vpp: plugin not loaded (%s); this server runs without %s", reason, PROTECTIONS_OFF)


def register() -> None:
    """Zero-argument plugin function (see module docstring). Idempotent."""
    global _registered
    if _registered:
        return
    problem = _load_problem(sys.argv[1:])
    if problem is not None:
        cannot_load(problem, sys.argv[1:])
        _registered = True
        return

    from sglang.srt.plugins.hook_registry import HookType

    from sglang_vpp.sglang_plugin import cli_args, failure_report, input_guard, pd_guard, process_hooks
    from sglang_vpp.sglang_plugin.hook_targets import register_hook

    register_hook("sglang.srt.server_args.ServerArgs.add_cli_args", cli_args.after_add_cli_args, HookType.AFTER)
    register_hook("sglang.srt.server_args.ServerArgs.from_cli_args", cli_args.around_from_cli_args, HookType.AROUND)
    register_hook(process_hooks.PUBLISH_TARGET, process_hooks.before_publish, HookType.BEFORE)
    register_hook(input_guard.VALIDATE_REQUEST_TARGET, input_guard.check_request_tokens, HookType.BEFORE)
    if cli_args.starts_a_prefill_server(sys.argv[1:]):  # its bootstrap server lives in the launcher
        register_hook(pd_guard.SETUP_ROUTES, pd_guard.after_setup_routes, HookType.AFTER)
    register_hook(failure_report.WATCHDOG_START_TARGET, failure_report.remember_ranks, HookType.BEFORE)
    register_hook(failure_report.SIGQUIT_HANDLER_TARGET, failure_report.around_sigquit_handler, HookType.AROUND)
    _registered = True
