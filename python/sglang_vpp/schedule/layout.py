"""Layer layouts: which layers each (virtual) stage holds and which rank runs each stage.

Two kinds:

- ``contiguous`` (CPP/DCPP): ``P`` stages, stage ``s`` on rank ``s``.
- ``foldback`` (VPP): ``2P`` virtual stages; rank ``r`` holds stages ``r`` and ``2P-1-r`` so a
  chunk travels down the ranks and back up (the V). See [Note: fold point has no comm].

Layers are split among stages evenly (the remainder goes to the earliest stages, deterministically)
or by an explicit list of per-stage layer counts (the knob for uneven splits, e.g. to make room for
embedding and lm_head, which both land on rank 0 with the fold-back layout).

[Note: fold point has no comm]
With the fold-back layout, stages ``P-1`` and ``P`` both live on the last rank ``P-1``: a chunk
goes from one to the other without any communication. Lowering and the validator rely on
``Layout.rank_of`` to decide when a hand-off needs a send/recv pair, so the fold needs no special
case anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

from .errors import LayoutError

__all__ = ["LayoutKind", "StageSpec", "Layout", "build_layout", "even_split"]


class LayoutKind(StrEnum):
    CONTIGUOUS = "contiguous"
    FOLDBACK = "foldback"


_KIND_ALIASES = {
    "contiguous": LayoutKind.CONTIGUOUS,
    "cpp": LayoutKind.CONTIGUOUS,
    "dcpp": LayoutKind.CONTIGUOUS,
    "foldback": LayoutKind.FOLDBACK,
    "fold-back": LayoutKind.FOLDBACK,
    "vpp": LayoutKind.FOLDBACK,
    "vpp-async": LayoutKind.FOLDBACK,
    "vpp-pack": LayoutKind.FOLDBACK,
    "vpp-taper": LayoutKind.FOLDBACK,
    "vpp-stream": LayoutKind.FOLDBACK,
}


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One (virtual) stage: a half-open range of layers run by one rank."""

    stage_index: int
    rank: int
    layer_start: int
    layer_end: int

    def __post_init__(self) -> None:
        assert 0 <= self.layer_start <= self.layer_end, self

    @property
    def num_layers(self) -> int:
        return self.layer_end - self.layer_start


@dataclass(frozen=True, slots=True)
class Layout:
    """Stages of a pipeline, in the order a chunk visits them."""

    kind: LayoutKind
    num_ranks: int
    num_layers: int
    stages: tuple[StageSpec, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def last_stage(self) -> int:
        return len(self.stages) - 1

    def rank_of(self, stage_index: int) -> int:
        return self.stages[stage_index].rank

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Stage indices held by ``rank``, in pipeline order."""
        return tuple(s.stage_index for s in self.stages if s.rank == rank)

    def to_dict(self) -> dict:
        return {
            "kind": str(self.kind),
            "num_ranks": self.num_ranks,
            "num_layers": self.num_layers,
            "stages": [
                {"stage": s.stage_index, "rank": s.rank, "layers": [s.layer_start, s.layer_end]}
                for s in self.stages
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        split = [stage["layers"][1] - stage["layers"][0] for stage in data["stages"]]
        return build_layout(data["num_ranks"], data["num_layers"], data["kind"], split)


def even_split(num_layers: int, num_stages: int) -> list[int]:
    """Per-stage layer counts, the remainder spread over the first stages."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if i < extra else 0) for i in range(num_stages)]


def _stage_ranks(kind: LayoutKind, num_ranks: int) -> list[int]:
    if kind is LayoutKind.CONTIGUOUS:
        return list(range(num_ranks))
    # Rank r holds s_r and s_{2P-1-r}: down the ranks, then back up.
    return list(range(num_ranks)) + list(reversed(range(num_ranks)))


def build_layout(
    num_ranks: int,
    num_layers: int,
    kind: LayoutKind | str = LayoutKind.CONTIGUOUS,
    split: Sequence[int] | None = None,
) -> Layout:
    """Build a layout; raise ``LayoutError`` naming the bad value and the fix."""
    if isinstance(kind, str) and not isinstance(kind, LayoutKind):
        if kind not in _KIND_ALIASES:
            raise LayoutError(
                f"unknown layout kind {kind!r}; expected one of {', '.join(sorted(_KIND_ALIASES))}"
            )
        kind = _KIND_ALIASES[kind]
    if not isinstance(num_ranks, int) or num_ranks < 1:
        raise LayoutError(f"pp size must be an integer >= 1, got {num_ranks!r}")
    if kind is LayoutKind.FOLDBACK and num_ranks < 2:
        raise LayoutError(
            f"the fold-back (vpp) layout needs at least 2 ranks, got pp={num_ranks}; "
            "use --pp 2 or more, or a contiguous mode (cpp)"
        )
    num_stages = num_ranks if kind is LayoutKind.CONTIGUOUS else 2 * num_ranks
    if not isinstance(num_layers, int) or num_layers < num_stages:
        raise LayoutError(
            f"{num_layers!r} layers cannot fill {num_stages} stages ({kind} layout, pp={num_ranks}): "
            f"every stage needs at least one layer; use a model with >= {num_stages} layers "
            "or a smaller pp size"
        )
    if split is None:
        counts = even_split(num_layers, num_stages)
    else:
        counts = list(split)
        if len(counts) != num_stages:
            raise LayoutError(
                f"layer split {counts} has {len(counts)} entries; the {kind} layout with "
                f"pp={num_ranks} has {num_stages} stages: give one count per stage"
            )
        bad = [c for c in counts if not isinstance(c, int) or c < 0]
        if bad:
            raise LayoutError(f"layer split {counts} has negative or non-integer counts {bad}")
        if sum(counts) != num_layers:
            raise LayoutError(
                f"layer split {counts} sums to {sum(counts)}, but the model has {num_layers} layers"
            )
        if any(c == 0 for c in counts):
            raise LayoutError(
                f"layer split {counts} leaves a stage empty; every stage needs at least one layer"
            )
    stages = []
    start = 0
    for index, (rank, count) in enumerate(zip(_stage_ranks(kind, num_ranks), counts)):
        stages.append(StageSpec(index, rank, start, start + count))
        start += count
    return Layout(kind, num_ranks, num_layers, tuple(stages))
