"""The seven policies, each a ``PolicySpec`` in its own module, and the registry of names."""

from . import cpp, dcpp, vpp, vpp_async, vpp_pack, vpp_stream, vpp_taper
from .spec import CommSemantics, Policy, PolicySpec, Priority
from ..errors import PolicyError
from ..layout import LayoutKind

__all__ = ["Policy", "PolicySpec", "CommSemantics", "Priority", "POLICIES", "FOLDBACK_MODES", "get_policy",
           "parse_policies"]

POLICIES: dict[Policy, PolicySpec] = {
    module.SPEC.name: module.SPEC for module in (cpp, dcpp, vpp, vpp_async, vpp_pack, vpp_taper, vpp_stream)
}
FOLDBACK_MODES: tuple[Policy, ...] = tuple(
    name for name, spec in POLICIES.items() if spec.layout_kind is LayoutKind.FOLDBACK
)
"""The VPP modes (``--pp-mode vpp | vpp-async | vpp-pack | vpp-taper | vpp-stream``)."""


def get_policy(name: str | Policy) -> PolicySpec:
    """The spec of a policy by name; an unknown name lists the valid ones."""
    try:
        return POLICIES[Policy(name)]
    except ValueError:
        valid = ", ".join(str(p) for p in POLICIES)
        raise PolicyError(f"unknown mode {name!r}; valid modes: {valid}") from None


def parse_policies(text: str) -> list[PolicySpec]:
    """``"cpp,vpp-pack"`` -> specs, in order, without duplicates."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise PolicyError("no mode given; valid modes: " + ", ".join(str(p) for p in POLICIES))
    specs = [get_policy(name) for name in names]
    return list(dict.fromkeys(specs))
