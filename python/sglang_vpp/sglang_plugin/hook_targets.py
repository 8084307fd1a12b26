"""Registering the plugin's hooks, and the checks that each target exists and took effect.

SGLang's ``HookRegistry.apply_hooks`` only logs a target it cannot patch, so a renamed function
would leave a server running half-patched. Hence:

- ``HOOK_TARGETS`` is the ``Use.HOOK`` part of the declared SGLang surface (``surface.py``): every
  target with the parameters its hook relies on and the scope that needs it;
- ``register_hook`` is the plugin's only way to register a hook: it refuses a target that is not
  declared as a hook (so a hook added later is checked like the others), remembers what the
  target was, and registers a (target, hook) pair once per process, so set-up that runs again
  in a process (``publish`` for another record, an install called twice) never wraps a target
  twice and needs no flag of its own;
- ``find_target_problems`` resolves declared names and checks their signatures before anything
  starts (``surface.find_problems``);
- ``find_unapplied`` runs after ``apply_hooks`` and names every registered target that is still
  the original function; ``require_applied`` raises on such a target whose hook no mode may run
  without (the input guard, the failure report, the stock-loop watchdog).
"""

from __future__ import annotations

import logging
import pkgutil
from typing import Any, Callable

from sglang_vpp.sglang_plugin.surface import SURFACE, Scope, SurfaceName, Use, find_problems

logger = logging.getLogger(__name__)

__all__ = ["HOOK_TARGETS", "register_hook", "find_target_problems", "find_unapplied", "require_applied"]

HOOK_TARGETS: tuple[SurfaceName, ...] = tuple(name for name in SURFACE if name.use is Use.HOOK)
_BY_PATH = {target.path: target for target in HOOK_TARGETS}

_registered: dict[str, Any] = {}
"""Target path -> the object it resolved to when its hook was registered (this process)."""
_hooked: set[tuple[str, Callable]] = set()
"""(target path, hook) pairs registered in this process."""


def register_hook(path: str, hook: Callable, hook_type: Any) -> None:
    """``HookRegistry.register`` for a declared target, once per (target, hook) in this process,
    remembering the original to verify later."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert path in _BY_PATH, f"hook target {path} is not declared in surface.SURFACE as Use.HOOK: add it there"
    if (path, hook) in _hooked:
        return
    if path not in _registered:
        _registered[path] = _resolve(path)
    HookRegistry.register(path, hook, hook_type)
    _hooked.add((path, hook))


def find_target_problems(scopes: tuple[Scope, ...]) -> list[str]:
    """One line per declared name of ``scopes`` that is missing or whose signature changed."""
    return find_problems(scopes)


def find_unapplied(scopes: tuple[Scope, ...]) -> list[str]:
    """Targets of ``scopes`` registered in this process that are still the original object."""
    return [
        path for path, original in _registered.items()
        if _BY_PATH[path].scope in scopes and _resolve(path) is original
    ]


def require_applied(*paths: str) -> None:
    """Raise PluginError naming every target in ``paths`` whose hook is not in place."""
    from sglang_vpp.sglang_plugin.errors import PluginError
    from sglang_vpp.sglang_plugin.version import SUPPORTED_SGLANG_VERSION

    missing = [path for path in paths if path not in _registered or _resolve(path) is _registered[path]]
    if missing:
        raise PluginError(
            f"sglang-vpp could not hook {', '.join(missing)} (SGLang logged 'Failed to apply hooks' "
            f"above?); this SGLang build does not match the plugin: install sglang=={SUPPORTED_SGLANG_VERSION}"
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
