"""Who wins, by how much, and whether the difference is larger than the noise.

Pure Python, shared by ``sglang-vpp bench`` (replayed makespan and TTFT) and ``bench-serve``
(served TTFT). A metric is "lower is better" seconds, one value per repeat and mode.

Two ways to decide significance, chosen by how the repeats were taken:

- **paired** (``bench``'s equal-cost replay: every mode of one repeat is timed on the same cost
  model): the per-repeat relative difference ``mode / baseline - 1`` is computed repeat by repeat;
  it is significant when the repeats agree on its sign (at most one in five may disagree: with
  ``bench``'s default of 5 repeats, one disturbed repeat does not flip the verdict) and its median
  is at least ``MIN_EFFECT`` (1 %). Why the floor: the ranges are within one invocation, and the
  same command run again on the shared 2-vCPU host moved the equal-cost differences by a few
  percent (``docs/runtime-results.md``); sub-percent differences did not replicate.
- **unpaired** (separate measurements, e.g. one server after another): significant when the
  min-max ranges of the two modes do not overlap.

Either way a single repeat gives no range and never a significant result: the verdict then says
to run more repeats instead of naming a winner on one sample.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BASELINES", "MIN_EFFECT", "Comparison", "Verdict", "compare", "make_verdict"]

#: The stock modes every other mode is compared with.
BASELINES = ("cpp", "dcpp")
#: Paired differences smaller than this (relative) are never called significant (module docstring).
MIN_EFFECT = 0.01


@dataclass(frozen=True)
class Comparison:
    """``mode`` against ``baseline`` on one metric."""

    mode: str
    baseline: str
    relative: tuple[float, ...]
    """``mode / baseline - 1``: per repeat when paired, else (median, min-max bounds) of the ratio."""
    significant: bool
    repeats: int

    @property
    def median(self) -> float:
        return statistics.median(self.relative)

    @property
    def low(self) -> float:
        return min(self.relative)

    @property
    def high(self) -> float:
        return max(self.relative)

    @property
    def outcome(self) -> str:
        """``faster``, ``slower`` or ``no significant difference`` (never a number: it is the stable part)."""
        if not self.significant:
            return "no significant difference"
        return "faster" if self.median < 0 else "slower"

    def text(self) -> str:
        spread = f"{self.median:+.1%}" if self.repeats < 2 else f"{self.median:+.1%} [{self.low:+.1%} .. {self.high:+.1%}]"
        return f"{self.mode} vs {self.baseline}: {spread} -> {self.outcome}"

    def to_dict(self) -> dict:
        return {"mode": self.mode, "baseline": self.baseline, "relative_median": self.median,
                "relative_min": self.low, "relative_max": self.high, "repeats": self.repeats,
                "significant": self.significant, "outcome": self.outcome}


def compare(values: Mapping[str, Sequence[float]], mode: str, baseline: str, *, paired: bool) -> Comparison:
    """``mode`` against ``baseline`` (see the module docstring for the two significance rules)."""
    ours, theirs = list(values[mode]), list(values[baseline])
    repeats = min(len(ours), len(theirs))
    if paired:
        assert len(ours) == len(theirs), (mode, baseline, ours, theirs)
        relative = tuple(a / b - 1.0 for a, b in zip(ours, theirs))
        median = statistics.median(relative)
        disagree = sum(1 for r in relative if r * median <= 0)
        significant = repeats >= 2 and abs(median) >= MIN_EFFECT and disagree <= repeats // 5
    else:
        base = statistics.median(theirs)
        relative = (statistics.median(ours) / base - 1.0, min(ours) / base - 1.0, max(ours) / base - 1.0)
        significant = repeats >= 2 and (max(ours) < min(theirs) or min(ours) > max(theirs))
    return Comparison(mode, baseline, relative, significant, repeats)


@dataclass(frozen=True)
class Verdict:
    """Every mode against each baseline that was run, and the overall winner if there is one."""

    metric: str
    comparisons: tuple[Comparison, ...]
    winner: str | None
    """The mode significantly better than every other mode; None when no mode is."""
    repeats: int

    def headline(self) -> str:
        """One line whose words do not change with noise-level differences in the numbers."""
        if self.repeats < 2:
            return f"verdict ({self.metric}): one repeat gives no range; run --repeat 3 or more for a verdict"
        if self.winner is not None:
            return f"verdict ({self.metric}): {self.winner} wins (significantly lower than every other mode)"
        return f"verdict ({self.metric}): no mode is significantly lower than all others"

    def lines(self) -> list[str]:
        return [self.headline()] + [f"  {c.text()}" for c in self.comparisons]

    def to_dict(self) -> dict:
        return {"metric": self.metric, "winner": self.winner, "repeats": self.repeats, "headline": self.headline(),
                "comparisons": [c.to_dict() for c in self.comparisons]}


def make_verdict(values: Mapping[str, Sequence[float]], metric: str, *, paired: bool,
                 baselines: Sequence[str] = BASELINES) -> Verdict:
    """Compare every mode with each baseline present in ``values`` and find a winner (lower is better)."""
    modes = list(values)
    comparisons = tuple(compare(values, mode, base, paired=paired)
                        for base in baselines if base in values for mode in modes if mode != base)
    repeats = min((len(v) for v in values.values()), default=0)
    winner = None
    for mode in modes:
        others = [compare(values, mode, other, paired=paired) for other in modes if other != mode]
        if others and all(c.outcome == "faster" for c in others):
            winner = mode
    return Verdict(metric, comparisons, winner, repeats)
