"""Refuse to run when a hook did not take: SGLang's HookRegistry logs and skips a target it
cannot patch, which would silently leave the server without the behaviour the hook adds."""

from __future__ import annotations

import pkgutil

from sglang_vpp.sglang_plugin.errors import PluginError

__all__ = ["require_hook_applied"]


def require_hook_applied(target: str) -> None:
    """Raise PluginError unless ``target`` (a dotted path) is wrapped by HookRegistry."""
    owner, _, name = target.rpartition(".")
    try:
        patched = getattr(getattr(pkgutil.resolve_name(owner), name, None), "__wrapped__", None)
    except (ImportError, AttributeError, ValueError):
        patched = None
    if patched is None:
        raise PluginError(
            f"sglang-vpp could not hook {target} (SGLang logged 'Failed to apply hooks' above?); "
            "this SGLang build does not match the plugin: install sglang==0.5.23"
        )
