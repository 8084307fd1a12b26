"""``--pp-mode`` and the ``--vpp-*`` flags on SGLang's argument parser, and their validation.

Data flow (launcher process)::

    ServerArgs.add_cli_args(parser)        [AFTER hook: after_add_cli_args]
        -> our argument group is added; parser.parse_args is wrapped so that a bad combination
           exits with one line "<prog>: error: ..." and status 2 right after parsing
    parser.parse_args(argv) -> Namespace (SGLang's flags + pp_mode, vpp_layer_split, ...)
    ServerArgs.from_cli_args(namespace)    [AROUND hook: around_from_cli_args]
        -> dcpp sets enable_dynamic_chunking on the namespace first (it is a stock field); a vpp*
           mode sets both phases' graph capture off (validate.turn_graph_capture_off)
        -> the ServerArgs is built by SGLang, then carries PipelineOptions as _sglang_vpp
        -> on --device cpu, SGLang's GPU crash diagnostics default to off (failure_report.py)
           and a PD server gets the CPU guards of cpu_compat.apply_cpu_pd_args

After parsing, the launcher refuses to start (one line, status 2) unless every SGLang name the
server's mode relies on is there as declared (``surface.py``), the options survive the pickling
that carries them to the scheduler processes, and the plugin's launcher-side hooks took effect:
the input guard and the failure report.

``python -m sglang.launch_server`` and ``sglang serve`` both go through
``prepare_server_args``, so both get the flags (``sglang serve --help`` prints before plugins
load and does not list them; ``python -m sglang.launch_server --help`` does).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from typing import Any

from sglang_vpp.schedule import FOLDBACK_MODES, Policy
from sglang_vpp.schedule.auto_size import AUTO, SERVER_CAP, is_auto
from sglang_vpp.schedule.factory import DEFAULT_COST_DESCRIPTION
from sglang_vpp.sglang_plugin.cpu_compat import apply_cpu_pd_args
from sglang_vpp.sglang_plugin.errors import PpModeError
from sglang_vpp.sglang_plugin.failure_report import (
    SIGQUIT_HANDLER_TARGET,
    WATCHDOG_START_TARGET,
    use_cpu_crash_defaults,
)
from sglang_vpp.sglang_plugin.input_guard import verify_guard_installed
from sglang_vpp.sglang_plugin.hook_targets import require_applied
from sglang_vpp.sglang_plugin.options import (
    DEFAULT_COMM_TIMEOUT_S,
    EXPECTED_MODE_ENV,
    PipelineOptions,
    PpMode,
    SERVED_MODES,
    attach,
    check_options_travel,
    is_vpp_mode,
)
from sglang_vpp.sglang_plugin.validate import turn_graph_capture_off, validate_pipeline_args

__all__ = [
    "PLUGIN_FLAGS",
    "add_pipeline_args",
    "after_add_cli_args",
    "around_from_cli_args",
    "check_namespace",
    "check_pp_mode_name",
    "check_surface",
    "plugin_flags_in",
    "scopes_of_argv",
    "starts_a_prefill_server",
    "accept_auto_chunk",
    "resolve_auto_chunk",
]

logger = logging.getLogger(__name__)

PLUGIN_FLAGS = ("--pp-mode", "--vpp-layer-split", "--vpp-fold", "--vpp-trace", "--vpp-comm-timeout",
                "--vpp-cost-profile")
"""Every flag the plugin adds (a server started with one needs the plugin loaded)."""


def plugin_flags_in(argv: list[str]) -> list[str]:
    """The plugin flags among ``argv`` (``--flag`` or ``--flag=value``)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.split("=", 1)[0] in PLUGIN_FLAGS]


def _flag_value(argv: list[str], *names: str) -> str | None:
    for at, arg in enumerate(argv):
        name, _, value = arg.partition("=")
        if name in names:
            return value if value else (argv[at + 1] if at + 1 < len(argv) else None)
    return None


def starts_a_prefill_server(argv: list[str]) -> bool:
    """Whether ``argv`` starts a PD prefill server (before argparse runs)."""
    return _flag_value(argv, "--disaggregation-mode") == "prefill"


def scopes_of_argv(argv: list[str], generic_cpu: bool) -> tuple:
    """The surface scopes a server started with ``argv`` relies on (before argparse runs)."""
    from sglang_vpp.sglang_plugin.surface import scopes_for

    mode = _flag_value(argv, "--pp-mode") or PpMode.CPP.value
    pp_size = _flag_value(argv, "--pp-size", "--pipeline-parallel-size") or "1"
    try:
        check_pp_mode_name(mode)
        pp = int(pp_size)
    except (PpModeError, ValueError):
        mode, pp = PpMode.CPP.value, 1  # argparse names the bad value later
    return scopes_for(mode, pp, "--vpp-trace" in plugin_flags_in(argv), generic_cpu,
                      _flag_value(argv, "--disaggregation-mode"), _flag_value(argv, "--device"))


_WRAPPED_MARK = "_sglang_vpp_parse_wrapped"


def _size_or_auto(text: str) -> int | str:
    """``--chunked-prefill-size``'s type: SGLang's integer, or ``auto``."""
    return AUTO if is_auto(text) else int(text)


# argparse names the type in its error ("invalid <name> value: '4k'"), not the function.
_size_or_auto.__name__ = "int or 'auto'"


def accept_auto_chunk(parser: argparse.ArgumentParser) -> None:
    """Let SGLang's ``--chunked-prefill-size`` take ``auto`` (``resolve_auto_chunk`` then gives
    SGLang the cap); a no-op on a parser without the flag."""
    for action in parser._actions:
        if "--chunked-prefill-size" in action.option_strings and action.type is int:
            action.type = _size_or_auto
            action.help = (f"{action.help or ''} sglang-vpp: 'auto' with a vpp --pp-mode lets the controller "
                           "size each chunk.")


def resolve_auto_chunk(args: argparse.Namespace) -> None:
    """``--chunked-prefill-size auto`` -> the cap for SGLang and ``vpp_auto_chunk`` for the plugin."""
    if not is_auto(getattr(args, "chunked_prefill_size", None)):
        return
    mode = str(getattr(args, "pp_mode", PpMode.CPP.value))
    if not is_vpp_mode(mode):  # check_pp_mode_name ran first: the name is valid
        raise PpModeError(
            f"--chunked-prefill-size auto is sized by the VPP controller, which --pp-mode {mode} does not run; "
            f"use --pp-mode {', '.join(p.value for p in Policy if p in FOLDBACK_MODES)}, or pass a size such as 4096"
        )
    args.chunked_prefill_size = SERVER_CAP
    args.vpp_auto_chunk = True


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    """Add the plugin's flags to ``parser`` (idempotent)."""
    accept_auto_chunk(parser)
    if any("--pp-mode" in action.option_strings for action in parser._actions):
        return
    group = parser.add_argument_group("sglang-vpp pipeline modes")
    group.add_argument(
        "--pp-mode",
        type=str,
        # Checked in check_namespace rather than with choices=: argparse's own choice error
        # prints the whole usage block (hundreds of lines) before the one line that matters.
        metavar="{" + ",".join(mode.value for mode in SERVED_MODES) + "}",
        default=PpMode.CPP.value,
        help="Pipeline mode with --pp-size > 1: cpp = stock SGLang pipeline (default); "
        "dcpp = stock pipeline + --enable-dynamic-chunking; vpp = fold-back (V-shape) layer "
        "placement; vpp-async = vpp with one communication group per direction; vpp-pack = "
        "vpp-async + cross-request packing; vpp-taper = vpp-pack with chunks ramped at both ends "
        "of a request (--chunked-prefill-size is then the largest chunk); vpp-stream = vpp-async with "
        "requests streaming through the V (no request barrier, a deeper window) for mixed traffic.",
    )
    group.add_argument(
        "--vpp-layer-split",
        type=str,  # parsed in check_namespace, so a typo gets the one-line error too
        default=None,
        metavar="N0,N1,...",
        help="Layers per virtual stage s0..s(2P-1) for vpp modes (rank r holds s_r and "
        "s_(2P-1-r)); must add up to the model's layer count. Default: as even as possible.",
    )
    group.add_argument(
        "--vpp-fold",
        type=str,  # parsed in check_namespace, so a typo gets the one-line error too
        default=None,
        metavar="{split,fused}",
        help="vpp modes: split (default) runs the last rank's two virtual stages s_(P-1) and s_P as "
        "two forwards, as the method does; fused runs them as one forward over both layer ranges "
        "(one host overhead less per micro-batch there). --vpp-layer-split then takes 2P-1 counts.",
    )
    group.add_argument(
        "--vpp-trace",
        type=str,
        default=None,
        metavar="PATH",
        help="Any mode: write per-rank compute records and Perfetto (Chrome JSON) traces of the "
        "pipeline under PATH (read by sglang-vpp bench-serve --launch).",
    )
    group.add_argument(
        "--vpp-comm-timeout",
        type=float,
        default=None,  # options.resolve_comm_timeout: flag > SGLANG_VPP_COMM_TIMEOUT_S > default
        metavar="SECONDS",
        help="vpp modes: fail a pipeline send/receive that waits longer than this. cpp/dcpp "
        "with --pp-size > 1: stop the server when a rank's stock loop waits on its peers longer "
        "than this (a stuck or dead rank). Default: SGLANG_VPP_COMM_TIMEOUT_S if set, else "
        f"{DEFAULT_COMM_TIMEOUT_S:g}.",
    )
    group.add_argument(
        "--vpp-cost-profile",
        type=str,
        default=None,
        metavar="FILE",
        help="vpp modes: stage costs the controller estimates with (packing budget), a fitted cost "
        f"model written by 'sglang-vpp bench --costs FILE'. Default: {DEFAULT_COST_DESCRIPTION}.",
    )


def check_pp_mode_name(name: str) -> None:
    """Raise PpModeError naming the valid modes unless ``name`` is one."""
    choices = [mode.value for mode in SERVED_MODES]
    if str(name) not in choices:
        raise PpModeError(
            f"argument --pp-mode: invalid choice: {str(name)!r} (choose from {', '.join(choices)})"
        )


def check_namespace(args: argparse.Namespace) -> PipelineOptions:
    """Parse and validate the plugin's part of ``args``; raise a PluginError when refused."""
    check_pp_mode_name(getattr(args, "pp_mode", PpMode.CPP.value))
    resolve_auto_chunk(args)
    options = PipelineOptions.from_namespace(args)
    validate_pipeline_args(args, options)
    if options.is_vpp:
        from sglang_vpp.sglang_plugin.vpp import check_args

        check_args(args, options)
    return options


def check_surface(args: argparse.Namespace, options: PipelineOptions) -> None:
    """Raise PpModeError naming every SGLang name this server relies on that is missing or changed."""
    from sglang_vpp.sglang_plugin.cpu_compat import is_generic_cpu_platform
    from sglang_vpp.sglang_plugin.surface import find_problems, refusal, scopes_for

    pp_size = int(getattr(args, "pp_size", 1) or 1)
    problems = find_problems(scopes_for(options.pp_mode, pp_size, bool(options.vpp_trace), is_generic_cpu_platform(),
                                        getattr(args, "disaggregation_mode", None), getattr(args, "device", None)))
    if problems:
        raise PpModeError(refusal(options.pp_mode, problems))


def _parse_and_check(parser: argparse.ArgumentParser, parse_args, *args: Any, **kwargs: Any):
    namespace = parse_args(*args, **kwargs)
    try:
        options = check_namespace(namespace)
        check_surface(namespace, options)
        verify_guard_installed()
        require_applied(WATCHDOG_START_TARGET, SIGQUIT_HANDLER_TARGET)
    except ValueError as exc:  # PluginError, and the VPP package's own config errors
        # Same shape as argparse's own errors, without the 3,000-line usage block.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return namespace


def after_add_cli_args(result: Any, parser: argparse.ArgumentParser) -> None:
    """AFTER hook on ``ServerArgs.add_cli_args`` (a staticmethod taking the parser)."""
    add_pipeline_args(parser)
    if not getattr(parser, _WRAPPED_MARK, False):
        parser.parse_args = functools.partial(_parse_and_check, parser, parser.parse_args)
        setattr(parser, _WRAPPED_MARK, True)
    return result


def around_from_cli_args(original, cls, args: argparse.Namespace):
    """AROUND hook on ``ServerArgs.from_cli_args``: apply dcpp, attach the options."""
    options = check_namespace(args) if hasattr(args, "pp_mode") else PipelineOptions()
    if options.pp_mode == PpMode.DCPP:
        # dcpp is exactly stock PP with SGLang's dynamic chunking switched on.
        args.enable_dynamic_chunking = True
    for flag in apply_cpu_pd_args(args):
        logger.info("sglang-vpp: --device cpu with --disaggregation-mode: %s (CUDA-only path)", flag)
    if options.is_vpp and getattr(args, "disaggregation_mode", None) == "prefill" \
            and not getattr(args, "disable_overlap_schedule", False):
        # SGLang's overlapped prefill result path sends a middle chunk's KV itself (from an index
        # the next chunk's scheduling overwrites); the VPP loop sends each chunk once both of the
        # rank's stages ran (vpp/pd_prefill.py), so that path must be off.
        args.disable_overlap_schedule = True
        logger.info("sglang-vpp: --pp-mode %s with --disaggregation-mode prefill: --disable-overlap-schedule",
                    options.pp_mode)
    if options.is_vpp:
        set_now = turn_graph_capture_off(args)
        if set_now:
            logger.info("sglang-vpp: --pp-mode %s runs each virtual stage as its own forward: %s",
                        options.pp_mode, ", ".join(set_now))
    server_args = original(cls, args)
    attach(server_args, options)
    if hasattr(args, "pp_mode"):
        try:
            check_options_travel(server_args)
        except PpModeError as exc:
            sys.exit(f"sglang-vpp: error: {exc}")
        os.environ[EXPECTED_MODE_ENV] = str(options.pp_mode)  # inherited by the scheduler processes
    use_cpu_crash_defaults(getattr(server_args, "device", None) or getattr(args, "device", None))
    return server_args
