"""The one SGLang version this plugin hooks into, and the check that enforces it."""

from __future__ import annotations

from sglang_vpp.sglang_plugin.errors import SGLangVersionError

__all__ = ["SUPPORTED_SGLANG_VERSION", "check_sglang_version"]

SUPPORTED_SGLANG_VERSION = "0.5.23"
"""Every hook target (module paths, signatures) was read from this release."""


def check_sglang_version(installed: str | None = None) -> str:
    """Return the installed SGLang version; raise SGLangVersionError unless it is supported."""
    if installed is None:
        from sglang.version import __version__ as installed
    if installed != SUPPORTED_SGLANG_VERSION:
        raise SGLangVersionError(
            f"sglang-vpp supports SGLang {SUPPORTED_SGLANG_VERSION} only, found {installed}; its "
            "hooks target internal functions of that release. Install it with "
            f"`pip install sglang=={SUPPORTED_SGLANG_VERSION}` (CPU-only machines: "
            "scripts/install_sglang_cpu.sh), or set SGLANG_PLUGINS to skip this plugin"
        )
    return installed
