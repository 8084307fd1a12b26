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
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BASELINES", "MAX_REPEATS", "MIN_EFFECT", "WIDTH", "Comparison", "Verdict", "check_repeats", "compare",
           "make_verdict", "percent", "percent_places", "ranges_overlap"]

#: The stock modes every other mode is compared with.
BASELINES = ("cpp", "dcpp")
#: Paired differences smaller than this (relative) are never called significant (module docstring).
MIN_EFFECT = 0.01
#: Printed verdict lines wrap to fit this many columns (a terminal's default width).
WIDTH = 80

MAX_REPEATS = 100
"""The most repeats of a comparison (``bench --repeat``, ``bench-serve --repeats``): twenty times
the default that keeps a verdict stable; each repeat runs every mode again."""


def check_repeats(repeats: int, flag: str, unit: str) -> None:
    """A repeat count in ``1..MAX_REPEATS``: the one check of ``bench --repeat`` and ``bench-serve
    --repeats``, in the command and in what runs them (``run_bench``, ``launch_servers``). ``flag``
    names the count in the message, ``unit`` what one repeat is (e.g. ``runs per mode``)."""
    if not isinstance(repeats, int):
        raise ValueError(f"{flag} must be an integer, got {repeats!r}")
    if repeats < 1:
        raise ValueError(f"{flag} must be >= 1, got {repeats}")
    if repeats > MAX_REPEATS:
        raise ValueError(f"{flag} must be at most {MAX_REPEATS} ({unit}), got {repeats}")
_GLUE = "\x00"  # stands for a space inside a phrase that must not be broken across lines


def _wrap(text: str, indent: str, keep: Sequence[str] = (), width: int = WIDTH) -> list[str]:
    """``text`` wrapped to ``width`` columns, continuation lines indented two more than ``indent``;
    no phrase of ``keep`` (e.g. "vpp-pack wins", "-> faster") and no mode name is split."""
    for phrase in keep:
        text = text.replace(phrase, phrase.replace(" ", _GLUE))
    lines = textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_long_words=False, break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines]


def ranges_overlap(low: float, high: float, other_low: float, other_high: float) -> bool:
    """Whether two min-max ranges share a value: the unpaired rule, under which overlapping
    ranges mean no significant difference (every unpaired verdict asks this function)."""
    return low <= other_high and other_low <= high


def percent_places(value: float, threshold: float, places: int = 1) -> int:
    """Decimals that print ``value`` as a percentage on the same side of ``threshold`` (a magnitude
    a verdict compares with) as it is: ``places``, or more where rounding would carry it onto or
    across the threshold ("+1.0%" for 0.97 % under a 1 % floor, "+10%" for 10.4 % over a 10 % band)."""
    limit = round(threshold * 100, 9)

    def side(magnitude_pct: float) -> int:
        return (magnitude_pct > limit) - (magnitude_pct < limit)

    for more in range(4):
        if side(abs(float(f"{value * 100:.{places + more}f}"))) == side(abs(value) * 100):
            return places + more
    return places + 3


def percent(value: float, threshold: float, places: int = 1) -> str:
    """``value`` as a signed percentage, with ``percent_places`` decimals."""
    return f"{value:+.{percent_places(value, threshold, places)}%}"


@dataclass(frozen=True)
class Comparison:
    """``mode`` against ``baseline`` on one metric."""

    mode: str
    baseline: str
    relative: tuple[float, ...]
    """``mode / baseline - 1``: per repeat when paired, else (median, min-max bounds) of the ratio."""
    significant: bool
    repeats: int
    paired: bool = True

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

    @property
    def reason(self) -> str:
        """Why a difference is not significant ("" when it is, or with one repeat)."""
        if self.significant or self.repeats < 2:
            return ""
        if not self.paired:
            return "min-max ranges overlap"
        return f"under the {MIN_EFFECT:.0%} floor" if abs(self.median) < MIN_EFFECT else "repeats disagree in sign"

    def range_text(self) -> tuple[str, str]:
        """The median and ``[low .. high]``, all with the decimals that keep the median on its side
        of the paired rule's floor (the unpaired rule has no floor)."""
        places = percent_places(self.median, MIN_EFFECT) if self.paired else 1
        return f"{self.median:+.{places}%}", f"[{self.low:+.{places}%} .. {self.high:+.{places}%}]"

    def text(self) -> str:
        median, bounds = self.range_text()
        spread = median if self.repeats < 2 else f"{median} {bounds}"
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.mode} vs {self.baseline}: {spread} -> {self.outcome}{why}"

    def lines(self, indent: str = "  ") -> list[str]:
        """``text()`` wrapped to ``WIDTH`` columns; the range and the outcome each stay on one line."""
        spread = self.range_text()[1] if self.repeats >= 2 else ""
        why = f"({self.reason})" if self.reason else ""
        return _wrap(self.text(), indent, keep=[k for k in (spread, f"-> {self.outcome}", why) if k])

    def to_dict(self) -> dict:
        return {"mode": self.mode, "baseline": self.baseline, "relative_median": self.median,
                "relative_min": self.low, "relative_max": self.high, "repeats": self.repeats,
                "significant": self.significant, "outcome": self.outcome, "reason": self.reason}


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
        significant = repeats >= 2 and not ranges_overlap(min(ours), max(ours), min(theirs), max(theirs))
    return Comparison(mode, baseline, relative, significant, repeats, paired)


@dataclass(frozen=True)
class Verdict:
    """Every mode against each baseline that was run, and the overall winner if there is one."""

    metric: str
    comparisons: tuple[Comparison, ...]
    winner: str | None
    """The mode significantly better than every other mode; None when no mode is."""
    repeats: int
    repeat_flag: str = "--repeat"
    """The command's flag for the number of repeats (named when one repeat gives no verdict)."""
    paired: bool = True
    baselines: tuple[str, ...] = BASELINES
    """The modes every other mode is compared with in ``comparisons``."""
    num_modes: int = 2

    def rule(self) -> str:
        """When a difference counts (printed under the headline, so each line explains itself)."""
        if self.paired:
            return f"significant: |median| >= {MIN_EFFECT:.0%} and the repeats agree in sign (1 in 5 may not)"
        return "significant: the min-max ranges over repeats do not overlap"

    def statement(self) -> str:
        """What the verdict says, in words that do not change with noise-level differences."""
        if self.num_modes < 2:
            return "one mode: nothing to compare"
        if self.repeats < 2:
            return f"one repeat gives no range; run {self.repeat_flag} 3 or more for a verdict"
        if self.winner is not None:
            return f"{self.winner} wins (significantly lower than every other mode)"
        return "no mode is significantly lower than all others"

    def baseline_note(self) -> str:
        """Says what the comparisons are against when no stock mode (``BASELINES``) was run."""
        if self.num_modes < 2 or any(base in BASELINES for base in self.baselines):
            return ""
        return (f"no {' or '.join(BASELINES)} among the modes: every mode compared with "
                f"{self.baselines[0]}, the first mode given")

    def headline(self) -> str:
        """The verdict as one string (JSON); ``lines()`` is the printed form."""
        return f"verdict ({self.metric}): {self.statement()}"

    def lines(self) -> list[str]:
        """The headline on two lines ("verdict (metric):", then the statement) and one entry per
        comparison, each line at most ``WIDTH`` columns."""
        keep = [f"{self.winner} wins"] if self.winner else []
        head = [*_wrap(f"verdict ({self.metric}):", ""), *_wrap(self.statement(), "  ", keep=keep)]
        if self.repeats >= 2 and self.num_modes >= 2:
            head += _wrap(self.rule(), "  ")
        if self.baseline_note():
            head += _wrap(self.baseline_note(), "  ")
        return head + [line for c in self.comparisons for line in c.lines()]

    def to_dict(self) -> dict:
        return {"metric": self.metric, "winner": self.winner, "repeats": self.repeats, "headline": self.headline(),
                "rule": self.rule(), "baselines": list(self.baselines),
                "comparisons": [c.to_dict() for c in self.comparisons]}


def make_verdict(values: Mapping[str, Sequence[float]], metric: str, *, paired: bool,
                 baselines: Sequence[str] = BASELINES, repeat_flag: str = "--repeat") -> Verdict:
    """Compare every mode with each baseline present in ``values`` and find a winner (lower is
    better). With no baseline present, the first mode of ``values`` is the baseline: a winner is
    named from comparisons with every other mode, so the printed ones must show some of them."""
    modes = list(values)
    present = tuple(base for base in baselines if base in values) or tuple(modes[:1])
    comparisons = tuple(compare(values, mode, base, paired=paired)
                        for base in present for mode in modes if mode != base)
    repeats = min((len(v) for v in values.values()), default=0)
    winner = None
    for mode in modes:
        others = [compare(values, mode, other, paired=paired) for other in modes if other != mode]
        if others and all(c.outcome == "faster" for c in others):
            winner = mode
    return Verdict(metric, comparisons, winner, repeats, repeat_flag, paired, present, len(modes))
