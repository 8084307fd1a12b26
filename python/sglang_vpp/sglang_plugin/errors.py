"""User-facing errors of the SGLang plugin: ValueError subclasses naming the bad value and the fix."""

from __future__ import annotations

__all__ = ["InputRejectedError", "PluginError", "PpModeError", "SGLangVersionError"]


class PluginError(ValueError):
    """Base class: a configuration the plugin refuses, with the fix in the message."""


class PpModeError(PluginError):
    """An invalid combination of ``--pp-mode`` / ``--vpp-*`` flags and SGLang flags."""


class SGLangVersionError(PluginError):
    """The installed SGLang is not the version this plugin hooks into."""


class InputRejectedError(ValueError):
    """A request the server refuses (HTTP 400) because it would crash the forward pass."""
