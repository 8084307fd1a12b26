"""The one seam between this plugin and the VPP implementation (``sglang_plugin/vpp/``).

Contract (owned by the VPP subpackage, called from here):

- ``sglang_vpp.sglang_plugin.vpp.install(server_args) -> None`` (required): registers the VPP
  hooks with SGLang's ``HookRegistry`` in the calling process. Called once per scheduler
  process (one per PP rank, per TP rank), before the Scheduler, the distributed groups and the
  model exist; the caller runs ``HookRegistry.apply_hooks()`` right after it.
  ``options_of(server_args)`` gives the PipelineOptions.
- ``sglang_vpp.sglang_plugin.vpp.check_args(args, options) -> None`` (optional): extra checks in
  the launcher, at argument-parsing time, before anything loads; raise a ``PluginError``
  subclass to refuse (shown as one line, exit status 2).

Until the subpackage exists, every vpp* mode fails with VppNotAvailableError: a vpp request must
never run stock PP silently.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from sglang_vpp.sglang_plugin.errors import VppNotAvailableError
from sglang_vpp.sglang_plugin.options import PipelineOptions

__all__ = ["VPP_MODULE", "check_vpp_args", "load_vpp_install"]

VPP_MODULE = "sglang_vpp.sglang_plugin.vpp"


def _import_vpp(mode: str) -> Any:
    try:
        return importlib.import_module(VPP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name not in (VPP_MODULE, "sglang_vpp.sglang_plugin"):
            raise  # the VPP package exists but one of its own imports is missing: show it
        raise VppNotAvailableError(
            f"--pp-mode {mode} is not available in this install: module {VPP_MODULE} is missing. "
            "Use --pp-mode cpp or dcpp, or install a sglang-vpp build that includes VPP"
        ) from None


def load_vpp_install(mode: str) -> Callable[[Any], None]:
    """Return ``vpp.install``; raise VppNotAvailableError when the VPP code is absent."""
    module = _import_vpp(mode)
    install = getattr(module, "install", None)
    if not callable(install):
        raise VppNotAvailableError(
            f"--pp-mode {mode} is not available in this install: {VPP_MODULE}.install is "
            "missing. Use --pp-mode cpp or dcpp until VPP lands"
        )
    return install


def check_vpp_args(args: Any, options: PipelineOptions) -> None:
    """Launcher-side: make sure VPP is installed and run its optional ``check_args``."""
    load_vpp_install(str(options.pp_mode))
    check_args = getattr(importlib.import_module(VPP_MODULE), "check_args", None)
    if callable(check_args):
        check_args(args, options)
