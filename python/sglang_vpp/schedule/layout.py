"""Layer layouts: which layers each (virtual) stage holds and which rank runs each stage.

Two kinds:

- ``contiguous`` (CPP/DCPP): ``P`` stages, stage ``s`` on rank ``s``.
- ``foldback`` (VPP): ``2P`` virtual stages; rank ``r`` holds stages ``r`` and ``2P-1-r`` so a
  chunk travels down the ranks and back up (the V). See [Note: fold point has no comm].

A fold-back layout has a ``fold``: ``split`` (the method's, above) or ``fused`` (see
[Note: fused fold]).

Layers are split among stages evenly (the remainder goes to the earliest stages, deterministically)
or by an explicit list of per-stage layer counts (the knob for uneven splits, e.g. to make room for
embedding and lm_head, which both land on rank 0 with the fold-back layout).

[Note: fold point has no comm]
With the fold-back layout, stages ``P-1`` and ``P`` both live on the last rank ``P-1``: a chunk
goes from one to the other without any communication. Lowering and the validator rely on
``Layout.rank_of`` to decide when a hand-off needs a send/recv pair, so the fold needs no special
case anywhere else.

[Note: fused fold]
Since the two stages at the fold hold contiguous layers and hand off without communication,
the fused fold runs them as ONE stage: ``2P-1`` stages, stage ``P-1`` (layers of the method's
``s_{P-1}`` and ``s_P``) on rank ``P-1``, stage ``s`` > ``P-1`` on rank ``2P-2-s``. The fold rank
then runs one forward per micro-batch instead of two, saving the second forward's host time
(stage switch, attention metadata, first launch: the micro-batch is set up once either way) per
micro-batch there and on every micro-batch's trip.
Every other rank still holds two stages, so the pairing that sizes the in-flight window
(rank r pairs chunk k+d with chunk k-d) and the work per rank are unchanged: the windows stay
at the method's ``2P-1``. Layer counts (``split``) are per stage, so ``2P-1`` of them; the
default is the method's even split over ``2P`` stages with the fold's two counts added, so
every rank holds the layers it holds with the split fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Sequence

from .errors import LayoutError

__all__ = ["Fold", "LayoutKind", "StageSpec", "Layout", "build_layout", "check_num_ranks", "even_split", "parse_fold",
           "stage_count"]


class LayoutKind(StrEnum):
    CONTIGUOUS = "contiguous"
    FOLDBACK = "foldback"


class Fold(StrEnum):
    """How a fold-back layout treats the two stages at the fold ([Note: fused fold])."""

    SPLIT = "split"
    """Two stages on the fold rank, one forward each (the method's)."""
    FUSED = "fused"
    """One stage over both layer ranges: one forward per micro-batch on the fold rank."""


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
    visit: int = 0
    """Which of its rank's stages this is, in pipeline order: 0 for the first a micro-batch
    reaches there, 1 for a fold-back layout's way back, where the rank already set the
    micro-batch up (a cost model charges the scheduler iteration once per rank)."""

    def __post_init__(self) -> None:
        assert 0 <= self.layer_start <= self.layer_end and self.visit >= 0, self

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
    fold: Fold = Fold.SPLIT
    """``fused``: the fold rank's two stages are one ([Note: fused fold]); always ``split`` for
    the contiguous layout, which has no fold."""

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def method_stages(self) -> int:
        """Stages of this kind's layout in the method (2P fold-back, P contiguous), whatever the
        fold: the depth the method's counts (the taper's chunks per stage) are stated for."""
        return _method_stage_count(self.kind, self.num_ranks)

    @property
    def last_stage(self) -> int:
        return len(self.stages) - 1

    @property
    def fold_rank(self) -> int:
        """The rank a fold-back chunk turns back on: it holds the fold's two stages, or the fused
        one ([Note: fold point has no comm]). The rank of the way down's last stage, ``P-1``."""
        assert self.kind is LayoutKind.FOLDBACK, "only a fold-back layout has a fold"
        return self.stages[self.num_ranks - 1].rank

    def rank_of(self, stage_index: int) -> int:
        return self.stages[stage_index].rank

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Stage indices held by ``rank``, in pipeline order."""
        return tuple(s.stage_index for s in self.stages if s.rank == rank)

    def to_dict(self) -> dict:
        """JSON form; ``fold`` only when fused, so split layouts keep their form (absent: split)."""
        out = {
            "kind": str(self.kind),
            "num_ranks": self.num_ranks,
            "num_layers": self.num_layers,
            "stages": [
                {"stage": s.stage_index, "rank": s.rank, "layers": [s.layer_start, s.layer_end]}
                for s in self.stages
            ],
        }
        if self.fold is Fold.FUSED:
            out["fold"] = str(self.fold)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        split = [stage["layers"][1] - stage["layers"][0] for stage in data["stages"]]
        return build_layout(data["num_ranks"], data["num_layers"], data["kind"], split,
                            data.get("fold", Fold.SPLIT))


def even_split(num_layers: int, num_stages: int) -> list[int]:
    """Per-stage layer counts, the remainder spread over the first stages."""
    base, extra = divmod(num_layers, num_stages)
    return [base + (1 if i < extra else 0) for i in range(num_stages)]


def _method_stage_count(kind: LayoutKind, num_ranks: int) -> int:
    return stage_count(kind, num_ranks, Fold.SPLIT)


def stage_count(kind: LayoutKind | str, num_ranks: int, fold: Fold | str = Fold.SPLIT) -> int:
    """Stages of a layout of ``kind`` over ``num_ranks`` ranks: P contiguous, 2P fold-back, 2P-1
    with a fused fold. The number of layer counts a split gives."""
    kind = _parse_kind(kind)
    # Counted without listing them: a plan's size is checked on this before any work, whatever --pp says
    # (len() of a range past sys.maxsize raises OverflowError; the arithmetic does not).
    return sum(_range_size(run) for run in _rank_runs(kind, num_ranks, parse_fold(fold)))


def _parse_kind(kind: LayoutKind | str) -> LayoutKind:
    """A layout kind, or the name of one or of a mode (``_KIND_ALIASES``)."""
    if isinstance(kind, LayoutKind):
        return kind
    if kind not in _KIND_ALIASES:
        raise LayoutError(f"unknown layout kind {kind!r}; expected one of {', '.join(sorted(_KIND_ALIASES))}")
    return _KIND_ALIASES[kind]


def _range_size(run: range) -> int:
    return max(0, (run.stop - run.start + run.step - (1 if run.step > 0 else -1)) // run.step)


def _rank_runs(kind: LayoutKind, num_ranks: int, fold: Fold) -> tuple[range, ...]:
    """The rank of each stage in pipeline order, as ranges (sized without being listed)."""
    if kind is LayoutKind.CONTIGUOUS:
        return (range(num_ranks),)
    # Rank r holds s_r and s_{2P-1-r}: down the ranks, then back up; fused, the way back up
    # starts on rank P-2 since the fold rank's two stages are one.
    back = num_ranks - 1 if fold is Fold.FUSED else num_ranks
    return range(num_ranks), range(back - 1, -1, -1)


def _stage_ranks(kind: LayoutKind, num_ranks: int, fold: Fold) -> list[int]:
    return [rank for run in _rank_runs(kind, num_ranks, fold) for rank in run]


def parse_fold(fold: Fold | str) -> Fold:
    """``fold`` as a ``Fold``; LayoutError naming the choices for anything else."""
    try:
        return Fold(fold)
    except ValueError:
        raise LayoutError(f"unknown fold {fold!r}; expected split (the method's) or fused "
                          "(the fold rank runs its two stages as one)") from None


def _fewer_ranks_fix(kind: LayoutKind, fold: Fold, split_given: bool, num_layers: object) -> str:
    """The fix for a pp size the layers cannot fill: the largest pp they can, or, where even the
    smallest pp needs more layers, the model that fills it (a model sized to a typo'd huge pp is
    no fix)."""
    least_ranks = 1 if kind is LayoutKind.CONTIGUOUS else 2
    least_layers = stage_count(kind, least_ranks, fold if split_given else Fold.SPLIT)
    if not isinstance(num_layers, int) or num_layers < least_layers:
        return f"the {kind} layout needs a model of >= {least_layers} layers (pp={least_ranks})"
    # P layers per stage count: P contiguous, 2P fold-back, 2P-1 for a split given to a fused fold.
    if kind is LayoutKind.CONTIGUOUS:
        largest = num_layers
    else:
        largest = (num_layers + 1) // 2 if split_given and fold is Fold.FUSED else num_layers // 2
    return f"the pp size is too large for {num_layers} layers: use --pp {largest} or less"


def check_num_ranks(num_ranks: int, kind: LayoutKind | str = LayoutKind.CONTIGUOUS, flag: str = "--pp") -> None:
    """The pipeline ranks a layout of ``kind`` takes: an integer >= 1, and >= 2 for the fold-back
    layout (its second half runs back down the ranks). The one check of the rank count for every
    command and executor config; ``flag`` names the count in the message (a server's ``--pp-size``).
    LayoutError."""
    if not isinstance(num_ranks, int):
        raise LayoutError(f"{flag} must be an integer, got {num_ranks!r}")
    if num_ranks < 1:
        raise LayoutError(f"{flag} must be >= 1, got {num_ranks}")
    if _parse_kind(kind) is LayoutKind.FOLDBACK and num_ranks < 2:
        raise LayoutError(f"the fold-back (vpp) layout needs {flag} >= 2, got {num_ranks}; use {flag} 2 or more, "
                          "or a contiguous mode (cpp)")


def build_layout(
    num_ranks: int,
    num_layers: int,
    kind: LayoutKind | str = LayoutKind.CONTIGUOUS,
    split: Sequence[int] | None = None,
    fold: Fold | str = Fold.SPLIT,
) -> Layout:
    """Build a layout; raise ``LayoutError`` naming the bad value and the fix. ``fold``: for the
    fold-back layout only ([Note: fused fold])."""
    fold = parse_fold(fold)
    kind = _parse_kind(kind)
    check_num_ranks(num_ranks, kind)
    if kind is LayoutKind.CONTIGUOUS and fold is Fold.FUSED:
        raise LayoutError("a fused fold needs the fold-back (vpp) layout; the contiguous layout (cpp, dcpp) "
                          "has no fold: use --fold split or a vpp mode")
    num_stages = stage_count(kind, num_ranks, fold)
    # A fused layout's default split is the method's, so it needs the method's 2P layers.
    least = num_stages if split is not None else _method_stage_count(kind, num_ranks)
    if not isinstance(num_layers, int) or num_layers < least:
        fused = (f", fused fold: its default split is the method's over {least} stages, merged into "
                 f"{num_stages}; a split of {num_stages} counts needs only {num_stages} layers"
                 if least > num_stages else "")
        raise LayoutError(
            f"{num_layers!r} layers cannot fill {least} stages ({kind} layout, pp={num_ranks}{fused}): "
            f"every stage needs at least one layer; {_fewer_ranks_fix(kind, fold, split is not None, num_layers)}"
        )
    if split is None and fold is Fold.FUSED:
        # The method's even split with the fold's two stages merged: the fold rank keeps its
        # share of the layers (an even split over 2P-1 stages would halve it).
        counts = even_split(num_layers, _method_stage_count(kind, num_ranks))
        counts[num_ranks - 1:num_ranks + 1] = [counts[num_ranks - 1] + counts[num_ranks]]
    elif split is None:
        counts = even_split(num_layers, num_stages)
    else:
        counts = list(split)
        if len(counts) != num_stages:
            fused = " (fused fold)" if fold is Fold.FUSED else ""
            raise LayoutError(
                f"layer split {counts} has {len(counts)} entries; the {kind} layout{fused} with "
                f"pp={num_ranks} has {num_stages} stages: give one count per stage"
            )
        bad = [c for c in counts if not isinstance(c, int) or c < 0]
        if bad:
            raise LayoutError(f"layer split {counts} has negative or non-integer counts {bad}")
        if sum(counts) != num_layers:
            raise LayoutError(
                f"layer split {counts} sums to {sum(counts)}, but the model has {num_layers} layers: make the "
                f"counts add up to {num_layers}, or give a model of {sum(counts)} layers (--layers where a command takes it)"
            )
        if any(c == 0 for c in counts):
            raise LayoutError(
                f"layer split {counts} leaves a stage empty; every stage needs at least one layer"
            )
    stages = []
    start = 0
    seen: dict[int, int] = {}
    for index, (rank, count) in enumerate(zip(_stage_ranks(kind, num_ranks, fold), counts)):
        stages.append(StageSpec(index, rank, start, start + count, seen.get(rank, 0)))
        seen[rank] = seen.get(rank, 0) + 1
        start += count
    return Layout(kind, num_ranks, num_layers, tuple(stages), fold)
