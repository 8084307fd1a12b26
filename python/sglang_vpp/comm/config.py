"""Configuration of a pipeline communicator: which groups, which rank pairs, which timeouts.

Constructing a ``CommConfig`` touches nothing (no process group, no device); ``create_communicator``
reads it. Every field is documented where it is declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..timeouts import COMM_TIMEOUT_S
from .errors import CommConfigError

__all__ = ["COMM_TIMEOUT_S", "CommConfig", "DEFAULT_GROUPS", "SERVED_COMM_TIMEOUT_S", "SINGLE_GROUP"]

DEFAULT_GROUPS = ("fwd", "bwd")
SINGLE_GROUP = ("pp",)
SERVED_COMM_TIMEOUT_S = 300.0
"""Default wait of a served pipeline's send or receive (and of a stock loop on its peers)
before it fails: long enough for a long prompt's chunk on a slow rank, short enough that a dead
rank stops the server within minutes (``--vpp-comm-timeout``; at most ``timeouts.MAX_TIMEOUT_S``)."""

_GROUP_RE = re.compile(r"[a-z][a-z0-9_]{0,11}")


@dataclass(frozen=True)
class CommConfig:
    group_names: tuple[str, ...] = DEFAULT_GROUPS
    """Communicators per rank pair, one per name. ``("fwd", "bwd")``: forward sweep r -> r+1 and
    fold-back r+1 -> r, as vpp-async and vpp-pack schedules use. ``("pp",)``: one group, as cpp, dcpp
    and plain vpp use (both directions then share one ordered communicator)."""

    timeout_s: float = COMM_TIMEOUT_S
    """Default timeout of every wait (``handle.wait()``, ``send``, ``recv``, ``wait_any``), after which
    a ``CommTimeoutError`` names rank, peer, group and action."""

    transport_timeout_s: float | None = None
    """Timeout given to every process group (``new_group`` does not inherit the init timeout) and
    deadline of each operation inside its channel thread. Default: ``timeout_s + max(2, timeout_s/2)``.
    Longer than ``timeout_s`` on purpose: a caller's wait reports the stuck operation first, cleanly;
    then the transport aborts the operation so that no thread waits forever."""

    pairs: tuple[tuple[int, int], ...] | None = None
    """Rank pairs that get communicators. ``None``: neighbours ``(r, r+1)``, which is all a fold-back
    pipeline needs. Add e.g. ``(0, P-1)`` for ring traffic."""

    warmup: bool = True
    """Exchange one small message on every link at creation, in one global order (deadlock-free).
    Sets up lazily connected NCCL/HCCL communicators before the first real transfer and proves every
    link works; the distinct-communicator check runs after it, when device communicators exist."""

    check_distinct: bool = True
    """Verify that the groups of one rank pair are distinct communicators (raises
    ``CommunicatorAliasError``). Turn off only to demonstrate the hazard."""

    backend_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments for the backend's constructor, e.g. ``{"hccl_buffer_size_mb": 256}``."""

    def __post_init__(self) -> None:
        if not self.group_names:
            raise CommConfigError("group_names is empty. Fix: use ('fwd', 'bwd') or ('pp',).")
        for name in self.group_names:
            if not isinstance(name, str) or not _GROUP_RE.fullmatch(name):
                raise CommConfigError(
                    f"group name {name!r} is not 1-12 lowercase letters, digits or '_' starting with a "
                    "letter (it becomes part of HCCL's 32-character communicator name). "
                    "Fix: use e.g. 'fwd', 'bwd' or 'pp'."
                )
        if len(set(self.group_names)) != len(self.group_names):
            raise CommConfigError(f"group_names {self.group_names} repeats a name. Fix: make them unique.")
        if not self.timeout_s > 0:
            raise CommConfigError(f"timeout_s must be > 0, got {self.timeout_s!r}. Fix: pass seconds, e.g. {COMM_TIMEOUT_S:g}.")
        if self.transport_timeout_s is not None and not self.transport_timeout_s >= self.timeout_s:
            raise CommConfigError(
                f"transport_timeout_s {self.transport_timeout_s!r} is shorter than timeout_s {self.timeout_s!r}: "
                "the transport would abort before the caller's wait can report the stuck operation. "
                "Fix: leave it None or make it >= timeout_s."
            )
        if self.pairs is not None:
            for pair in self.pairs:
                if (len(pair) != 2 or not all(isinstance(r, int) and r >= 0 for r in pair)
                        or pair[0] == pair[1]):
                    raise CommConfigError(
                        f"rank pair {pair!r} is not two different ranks >= 0. Fix: e.g. pairs=((0, 1), (1, 2))."
                    )

    @property
    def effective_transport_timeout_s(self) -> float:
        if self.transport_timeout_s is not None:
            return self.transport_timeout_s
        return self.timeout_s + max(2.0, self.timeout_s / 2)

    def resolved_pairs(self, world_size: int) -> tuple[tuple[int, int], ...]:
        """Sorted, de-duplicated ``(low, high)`` pairs; the same order on every rank."""
        raw = self.pairs if self.pairs is not None else tuple((r, r + 1) for r in range(world_size - 1))
        pairs = sorted({(min(a, b), max(a, b)) for a, b in raw})
        for a, b in pairs:
            if b >= world_size:
                raise CommConfigError(
                    f"rank pair ({a}, {b}) names rank {b} but the world has {world_size} ranks. "
                    f"Fix: use ranks 0..{world_size - 1}."
                )
        return tuple(pairs)
