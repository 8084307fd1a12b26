"""Chunkers: how many tokens the next prefill chunk of a request takes.

A chunker answers one question, ``next_chunk_size(prefix_len, remaining)``, so the same object
serves an offline plan (``split_request``) and an online loop that chunks a request one step at a
time while other requests run.

- ``FixedChunker``: a constant chunk size (CPP and every VPP mode); ``FlatCurveFallback`` is one
  that stands in for DCPP when the latency fit has nothing to balance.
- ``TaperedChunker``: fixed chunks with short geometric ramps at both ends of a request (the
  ``vpp-taper`` mode): a small first chunk shortens the pipeline fill, and halving chunks at the
  tail shorten the drain, which is what a deep fold-back pipeline loses most to.
- ``DynamicChunker``: DCPP, SGLang's ``--enable-dynamic-chunking`` restated: a fitted prefill
  latency curve ``f(l) = a l^2 + b l + c``; the next chunk ``x`` after prefix ``L`` solves
  ``f(L + x) - f(L) = T`` with ``T = f(base) - f(0)``; then smoothing toward ``base``
  (``base + s (x - base)``), a floor (``base // 4`` unless ``min_chunk_size`` is set), alignment down to ``alignment`` tokens, and
  caps by the remaining tokens and ``max_prefill_tokens``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from .errors import ChunkingError, FlatCurveError

__all__ = [
    "Chunker",
    "FixedChunker",
    "FlatCurveFallback",
    "TaperedChunker",
    "QuadraticCurve",
    "DynamicChunker",
    "fit_quadratic",
    "split_request",
    "parse_size",
    "MAX_CHUNKS_PER_REQUEST",
    "check_chunk_count",
    "check_chunk_counts",
    "MAX_PLAN_WORK",
    "RANKS_PER_EVENT",
    "check_plan_work",
    "check_alignment",
    "check_chunk_size",
    "check_concurrency",
    "check_num_requests",
    "check_request_count",
    "plan_work",
]

MAX_CHUNKS_PER_REQUEST = 16384
"""The most chunks of the chunk size a request may be cut into (1M tokens at 64-token chunks).
Planning time and memory grow with the chunk count, and 1M chunks of one token took a minute and
a gigabyte before the first line of output; the largest legitimate cut is far below (``auto``'s
smallest candidate cuts 1M tokens into 4096 chunks; the test suite's largest request is about
2000 chunks). ``DynamicChunker`` may cut up to four times as many, down to its floor."""

MAX_PLAN_WORK = 4194304
"""The most work one mode's plan of a run may take, in stage computations: each chunk is computed
once on every stage, and the planner, the dry run (``check``) and the simulator each handle one
event per computation, so the work is chunks x stages. Beyond ``RANKS_PER_EVENT`` ranks, the
planner's visit of every rank at each event outweighs the rest of the event, and the work is
multiplied by ranks / ``RANKS_PER_EVENT``. The simulator handles about 8,000 computations a second
on the 2-core development machine, so this bounds one mode's run to about nine minutes there: a
bound against typos, not a budget. Paper-scale runs fit with room to spare (100 prompts of 1M
tokens at 2K chunks on 8 ranks, 16 stages: 819,200; 500 of 1M at 16K on 16 ranks: 1,024,000),
while 8-token chunks of the default mixed workload on a pp-2 fold-back plan (1.4M chunks on 4
stages) and a deep plan of few chunks per stage (``check --pp 128 --layers 256 --seq-len 512k
--chunk-size 32``: 16384 chunks on 256 stages of 128 ranks) are refused."""

RANKS_PER_EVENT = 24
"""Ranks up to which the planner's per-event cost is flat (measured: 12 us an event at pp 2, 19 us
at pp 32, 70 us at pp 128); ``MAX_PLAN_WORK`` charges deeper plans in proportion to their ranks."""


def plan_work(num_chunks: int, num_stages: int, num_ranks: int) -> int:
    """The work of planning ``num_chunks`` chunks on ``num_stages`` stages of ``num_ranks`` ranks,
    in the units of ``MAX_PLAN_WORK``."""
    return num_chunks * num_stages * max(num_ranks, RANKS_PER_EVENT) // RANKS_PER_EVENT


def check_chunk_size(chunk_size: int, size_name: str = "chunk size") -> None:
    """A chunk size is an integer >= 1 token: the one check of every chunker and executor config
    (the CLI's size flags refuse what ``parse_size`` cannot read first). ``size_name`` names it in the
    message (e.g. ``--chunk-size``)."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ChunkingError(f"{size_name} must be an integer >= 1 token, got {chunk_size!r}")


def check_num_requests(num_requests: int, count_name: str = "requests", fix: str = "") -> None:
    """A run sends at least one request: the one lower bound of every request count (the upper is
    ``check_request_count``'s). ``count_name`` names the count (e.g. ``--requests``); ``fix``, when
    given, follows the message."""
    if not isinstance(num_requests, int):
        raise ChunkingError(f"{count_name} must be an integer, got {num_requests!r}")
    _check_at_least_one(num_requests, count_name, fix, ChunkingError)


def check_concurrency(concurrency: int | None, name: str = "concurrency", fix: str = "",
                      error: type[ValueError] = ChunkingError) -> None:
    """Requests in flight at most (closed-loop clients) are None (open loop, or the default) or
    >= 1: the one check of a workload's, of ``simulate --concurrency`` and of ``bench-serve
    --concurrency``. ``name`` names it in the message; ``fix``, when given, follows it; ``error``
    is the caller's type (a workload's ``WorkloadError``, ``bench-serve``'s ``CliInputError``)."""
    if concurrency is not None:
        _check_at_least_one(concurrency, name, fix, error)


def _check_at_least_one(value: int, name: str, fix: str, error: type[ValueError]) -> None:
    """The one message of a count below 1 (``fix``, when given, follows it)."""
    if value < 1:
        raise error(f"{name} must be >= 1, got {value}" + (f"; {fix}" if fix else ""))


def check_alignment(alignment: int) -> None:
    """Chunk sizes round to multiples of ``alignment`` tokens, at least 1: the one check of the
    tapered and the DCPP chunker."""
    if alignment < 1:
        raise ChunkingError(f"alignment must be >= 1, got {alignment}")


class Chunker(Protocol):
    def next_chunk_size(self, prefix_len: int, remaining: int) -> int: ...


@dataclass(frozen=True, slots=True)
class FixedChunker:
    chunk_size: int

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)

    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        return min(self.chunk_size, remaining)


@dataclass(frozen=True, slots=True)
class FlatCurveFallback(FixedChunker):
    """Fixed chunks where DCPP was asked for and its latency fit came out flat
    (``FlatCurveError``), as SGLang serves then; ``reason`` is the fit's message, for the
    executor to tell its user that this run is CPP in effect."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class TaperedChunker:
    """Body chunks of at most ``chunk_size``, ramped at the ends of a request (module docstring).

    - Body: ``min(chunk_size, max(min_body, length / min_chunks))`` tokens (aligned), so that a
      long request has at least ``min_chunks`` chunks (a fold-back pipeline of S stages keeps
      about S chunks in flight; a request with fewer never reaches its steady state), and no
      body chunk is so small that kernel efficiency and per-chunk costs dominate.
    - Head: a chunk never exceeds the prefix before it (``floor, floor, 2 floor, 4 floor, ...``
      up to the body size), so the first chunk reaches the deepest stage after a short fill.
    - Tail: a chunk takes at most half of what remains (``R/2, R/4, ...`` down to ``floor``),
      so the last chunk, whose long prefix makes each token costliest, is small and the drain
      behind it short.

    ``floor`` is the body size over ``ratio``; each ramp adds about ``log2(ratio)`` chunks. A
    request of at most two body chunks is cut like ``FixedChunker`` (no ramps).

    ``ratio``, ``min_chunks`` and ``min_body`` have no defaults: the mode's values are the policy's
    constants (``policies/vpp_taper.py``), which ``factory.tapered_chunker`` passes, and a second
    set here would be a second vpp-taper for a caller that forgot one.
    """

    chunk_size: int
    ratio: int
    min_chunks: int
    min_body: int
    alignment: int = 64

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)
        if self.ratio < 1:
            raise ChunkingError(f"taper ratio must be >= 1, got {self.ratio}")
        if self.min_chunks < 1:
            raise ChunkingError(f"min chunks per request must be >= 1, got {self.min_chunks}")
        if self.min_body < 1:
            raise ChunkingError(f"min body chunk must be >= 1 token, got {self.min_body}")
        check_alignment(self.alignment)

    @property
    def tapers(self) -> bool:
        """Whether any request is cut otherwise than in fixed chunks of ``chunk_size``. The ramps
        step down to ``floor``, which is at least one alignment unit: a chunk size of one unit
        or less (64 tokens by default) leaves them nothing to cut."""
        body = self.chunk_size
        align = min(self.alignment, body)
        return max(align, body // self.ratio // align * align) < body

    def body_size(self, length: int) -> int:
        """Tokens of a chunk in the middle of a ``length``-token request."""
        align = min(self.alignment, self.chunk_size)
        spread = -(-length // self.min_chunks)
        spread = -(-spread // align) * align
        return max(1, min(self.chunk_size, max(self.min_body, spread)))

    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        length = prefix_len + remaining
        body = self.body_size(length)
        if length <= 2 * body:
            return min(body, remaining)
        align = min(self.alignment, body)
        floor = max(align, body // self.ratio // align * align)
        if remaining <= floor:
            return remaining
        size = min(body, max(floor, prefix_len), max(floor, remaining // 2))
        size = max(floor, size // align * align)
        return min(size, remaining)


FLAT_CURVE_SHARE = 1e-9
"""A fit whose square term is below this share of the rest of the latency (linear and constant
terms) at the longest fitted length is flat (``FlatCurveError``): far above double rounding
(1e-16), far below any attention cost."""


@dataclass(frozen=True, slots=True)
class QuadraticCurve:
    """Prefill latency of a whole ``l``-token prompt: ``f(l) = a l^2 + b l + c``."""

    a: float
    b: float
    c: float

    def __call__(self, length: float) -> float:
        return (self.a * length + self.b) * length + self.c


def fit_quadratic(lengths: Sequence[float], latencies: Sequence[float]) -> QuadraticCurve:
    """Least-squares fit of ``f(l) = a l^2 + b l + c`` (normal equations, no numpy needed).

    Raises ``FlatCurveError`` when the fit is not usable for dynamic chunking (``a <= 0``, or
    negligible: ``FLAT_CURVE_SHARE``), as SGLang's profiler refuses it, and ``ChunkingError``
    when there is too little to fit; a negative linear term is clamped to zero.
    """
    if len(lengths) != len(latencies) or len(set(lengths)) < 3:
        raise ChunkingError(
            f"need >= 3 distinct lengths with one latency each to fit a quadratic, got "
            f"{len(set(lengths))} distinct lengths and {len(latencies)} latencies"
        )
    # Scale lengths to keep the 3x3 system well conditioned.
    scale = max(abs(x) for x in lengths) or 1.0
    xs = [x / scale for x in lengths]
    sums = [sum(x**k for x in xs) for k in range(5)]
    rhs = [sum(y * x**k for x, y in zip(xs, latencies)) for k in range(3)]
    matrix = [[sums[i + j] for j in range(3)] for i in range(3)]
    c0, c1, c2 = _solve3(matrix, rhs)
    a, b, c = c2 / scale**2, c1 / scale, c0
    # A curve linear (or constant) to within rounding fits a = +-1e-16 of the latencies: its
    # sign is noise, so "grows super-linearly" means the square term matters at the longest
    # length against the rest of the latency there, not merely a > 0.
    if not a * scale * scale > FLAT_CURVE_SHARE * (abs(b) * scale + abs(c)):
        raise FlatCurveError(
            f"fitted quadratic coefficient a={a:.3e} is not positive, or negligible against b={b:.3e}, "
            f"c={c:.3e} at {scale:g} tokens: latency does not grow "
            "super-linearly with length, so dynamic chunking has nothing to balance"
        )
    return QuadraticCurve(a, max(b, 0.0), c)


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float]:
    """Gaussian elimination with partial pivoting for a 3x3 system."""
    rows = [row[:] + [rhs] for row, rhs in zip(m, v)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-300:
            raise ChunkingError("quadratic fit is singular: sample more distinct lengths")
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, 3):
            factor = rows[r][col] / rows[col][col]
            for k in range(col, 4):
                rows[r][k] -= factor * rows[col][k]
    out = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        out[r] = (rows[r][3] - sum(rows[r][k] * out[k] for k in range(r + 1, 3))) / rows[r][r]
    return out[0], out[1], out[2]


@dataclass(frozen=True, slots=True)
class DynamicChunker:
    """DCPP chunk sizes from a fitted latency curve (see the module docstring)."""

    curve: QuadraticCurve
    base_chunk_size: int
    smooth_factor: float
    """Pull of the curve's chunk toward ``base_chunk_size`` (1.0: none). No default: dcpp's is
    ``policies.dcpp.SMOOTH_FACTOR`` (``factory.default_chunker`` passes it)."""
    alignment: int = 64
    max_prefill_tokens: int | None = None
    min_chunk_size: int | None = None
    """Floor of a chunk; SGLang uses ``base // 4`` (the default), the paper's DCPP baseline 4096."""

    def __post_init__(self) -> None:
        if self.min_chunk_size is not None and not 1 <= self.min_chunk_size <= self.base_chunk_size:
            raise ChunkingError(
                f"min chunk size must lie in [1, base chunk size {self.base_chunk_size}], got {self.min_chunk_size}"
            )
        check_chunk_size(self.base_chunk_size, "base chunk size")
        if not 0.0 <= self.smooth_factor <= 1.0:
            raise ChunkingError(f"smooth factor must lie in [0, 1], got {self.smooth_factor}")
        check_alignment(self.alignment)
        if self.curve.a <= 0:
            raise ChunkingError(f"curve needs a > 0, got a={self.curve.a}")

    @classmethod
    def from_latency_fn(
        cls,
        latency: Callable[[int], float],
        base_chunk_size: int,
        max_length: int,
        num_samples: int = 128,
        *,
        smooth_factor: float,
        **kwargs,
    ) -> "DynamicChunker":
        """Fit the curve on ``num_samples`` prompt lengths up to ``max_length`` (at least the
        three a quadratic needs, e.g. for 1-token chunks of a 1-token prompt), like SGLang's
        start-up profiler (which times that many synthetic prefills)."""
        max_length = max(max_length, 3)
        step = max(1, max_length // num_samples)
        lengths = list(range(step, max_length + 1, step))
        return cls(fit_quadratic(lengths, [latency(n) for n in lengths]), base_chunk_size, smooth_factor, **kwargs)

    @property
    def target_latency(self) -> float:
        return self.curve(self.base_chunk_size) - self.curve(0)

    def ideal_chunk_size(self, prefix_len: int) -> float:
        """The real root ``x`` of ``f(L + x) - f(L) = T``."""
        a, b = self.curve.a, self.curve.b
        linear = 2 * a * prefix_len + b
        return (-linear + math.sqrt(linear * linear + 4 * a * self.target_latency)) / (2 * a)

    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        base = self.base_chunk_size
        smoothed = base + self.smooth_factor * (self.ideal_chunk_size(prefix_len) - base)
        floor = self.min_chunk_size if self.min_chunk_size is not None else base // 4
        # The root is computed in floating point: at L = 0 it is ``base`` up to rounding, and a
        # plain int() of 511.99999 would then align a 512 chunk down to 448.
        size = max(int(smoothed + 1e-6 * max(1.0, smoothed)), floor)
        # Alignment never exceeds the base size: tiny test models use chunks below 64 tokens.
        align = min(self.alignment, base)
        size = max(align, size // align * align)
        if self.max_prefill_tokens is not None:
            size = min(size, max(align, self.max_prefill_tokens // align * align))
        return min(size, remaining)


def split_request(chunker: Chunker, length: int) -> list[tuple[int, int]]:
    """(start, num_tokens) for every chunk of a ``length``-token prompt."""
    chunks = []
    start = 0
    while start < length:
        size = chunker.next_chunk_size(start, length - start)
        assert size >= 1, (chunker, start, length)
        chunks.append((start, size))
        start += size
    return chunks


def check_chunk_count(length: int, chunk_size: int, size_name: str = "chunk size",
                      length_name: str = "a request") -> None:
    """Refuse cutting a ``length``-token request into more than ``MAX_CHUNKS_PER_REQUEST`` chunks of
    ``chunk_size`` (every chunker's chunks are at most ``chunk_size``, so this is the fewest it
    cuts). ``size_name`` and ``length_name`` name them in the message (e.g. the CLI's flags)."""
    count = -(-length // chunk_size)
    if count > MAX_CHUNKS_PER_REQUEST:
        smallest = -(-length // MAX_CHUNKS_PER_REQUEST)
        raise ChunkingError(
            f"{length_name} of {length} tokens at {size_name} {chunk_size} is {count} chunks, more than the "
            f"limit of {MAX_CHUNKS_PER_REQUEST} per request; raise {size_name} to {smallest} or more"
        )


def check_chunk_counts(lengths: Sequence[int], chunk_size: int, num_stages: int, num_ranks: int,
                       size_name: str = "chunk size", length_name: str = "a request",
                       workload_name: str = "the workload") -> None:
    """Both limits for one load: the longest request (``check_chunk_count``) and the work of the
    whole run on ``num_stages`` stages of ``num_ranks`` ranks (``check_plan_work``). Every command
    that plans chunks checks its load here before any work starts."""
    if not lengths:
        raise ChunkingError(f"{workload_name} has no requests")
    check_chunk_count(max(lengths), chunk_size, size_name, length_name)
    check_plan_work(lengths, chunk_size, num_stages, num_ranks, size_name, workload_name)


def _depth(num_stages: int, num_ranks: int) -> str:
    """The plan's depth as the limit's messages name it: the ranks too where they count."""
    return f"{num_stages} stages" + (f" of {num_ranks} ranks" if num_ranks > RANKS_PER_EVENT else "")


def check_request_count(num_requests: int, num_stages: int, num_ranks: int, count_name: str = "requests") -> None:
    """Refuse ``num_requests`` requests that exceed ``MAX_PLAN_WORK`` at one chunk each, before a
    caller builds their list: a count typed with extra digits would otherwise take minutes and
    gigabytes just to be listed and summed (and fewer than one, ``check_num_requests``).
    ``count_name`` names the count (e.g. a flag)."""
    check_num_requests(num_requests, count_name)
    if plan_work(num_requests, num_stages, num_ranks) <= MAX_PLAN_WORK:
        return
    most = 1
    while plan_work(most * 2, num_stages, num_ranks) <= MAX_PLAN_WORK:
        most *= 2
    low, high = most, most * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if plan_work(middle, num_stages, num_ranks) <= MAX_PLAN_WORK else (low, middle)
    fits = (f"send at most {low} requests or plan fewer stages (a smaller pp)"
            if plan_work(1, num_stages, num_ranks) <= MAX_PLAN_WORK else "plan fewer stages (a smaller pp)")
    raise ChunkingError(f"{count_name} {num_requests} is at least {num_requests} chunks on "
                        f"{_depth(num_stages, num_ranks)}, more than the limit of {MAX_PLAN_WORK} units of planning work per run at any chunk "
                        f"size; {fits}")


def check_plan_work(lengths: Sequence[int], chunk_size: int, num_stages: int, num_ranks: int,
                    size_name: str = "chunk size", workload_name: str = "the workload") -> None:
    """Refuse a plan of requests of ``lengths`` tokens cut into chunks of ``chunk_size`` (the fewest
    any chunker cuts) on ``num_stages`` stages of ``num_ranks`` ranks whose ``plan_work`` exceeds
    ``MAX_PLAN_WORK``; the message names the smallest chunk size that fits, if any does."""
    def chunks(size: int) -> int:
        return sum(-(-length // size) for length in lengths)

    def work(size: int) -> int:
        return plan_work(chunks(size), num_stages, num_ranks)

    count = chunks(chunk_size)
    if work(chunk_size) <= MAX_PLAN_WORK:
        return
    depth = _depth(num_stages, num_ranks)
    unit = "chunks x stages" + (f" x ranks/{RANKS_PER_EVENT}" if num_ranks > RANKS_PER_EVENT else "")
    what = (f"{workload_name} ({len(lengths)} requests, {sum(lengths)} tokens) at {size_name} {chunk_size} is "
            f"{count} chunks on {depth}: {work(chunk_size)} units of planning work ({unit}), more than the "
            f"limit of {MAX_PLAN_WORK} per run")
    if work(max(lengths)) > MAX_PLAN_WORK:  # one chunk per request is already too much
        raise ChunkingError(f"{what} at any chunk size; send fewer requests or plan fewer stages (a smaller pp)"
                            if len(lengths) > 1 else f"{what} at any chunk size; plan fewer stages (a smaller pp)")
    # The smallest size that fits: the work falls as the size grows and fits at the longest
    # length, so a bisection between the two finds it.
    low, high = chunk_size, max(lengths)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if work(middle) <= MAX_PLAN_WORK else (middle, high)
    fewer = ", send fewer requests" if len(lengths) > 1 else ""
    raise ChunkingError(f"{what}; raise {size_name} to {high} or more{fewer} or plan fewer stages (a smaller pp)")


_SUFFIXES = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_size(text: str | int) -> int:
    """Token counts with suffixes: ``16k`` = 16384, ``1m`` = 1048576, ``3000`` = 3000."""
    if isinstance(text, int):
        value = text
    else:
        raw = text.strip().lower()
        suffix = raw[-1] if raw and raw[-1] in "km" else ""
        number = raw[: len(raw) - len(suffix)]
        try:
            value = int(float(number) * _SUFFIXES[suffix]) if number else -1
        except (ValueError, OverflowError):  # OverflowError: inf
            value = -1
        if value < 0 or (number and float(number) * _SUFFIXES[suffix] != value):
            raise ChunkingError(f"cannot read size {text!r}; expected e.g. 512, 16k or 1m")
    if value < 1:
        raise ChunkingError(f"size must be >= 1, got {text!r}")
    return value
