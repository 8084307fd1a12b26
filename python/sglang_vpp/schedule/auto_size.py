"""``auto`` chunk size and batch budget: the schedule core plans the situation at each candidate.

Given the controller's cost estimate (the analytic preset, a fitted profile or the server's
``--vpp-cost-profile``), the layout (P, fold-back or not), the policy and the *situation* (the
prompt lengths waiting and in flight), ``AutoSizer.choose`` plans the situation with the real
``Planner`` once per candidate size (chunks of that size for a long request, a token budget of
that size for a batch of short ones, as SGLang's ``--chunked-prefill-size`` is both) and keeps
the candidate whose larger relative loss, in estimated makespan (throughput) and in mean
completion (TTFT) against the best candidate of each, is smallest (``score``): a size that
wins throughput by 1 % but costs 10 % TTFT loses to one within 3 % of both. Scores within
``TIE_TOLERANCE`` tie; the smaller makespan, then the smaller size decide. A fold-back mode with
fixed chunks also weighs vpp-taper's cut (``factory.tapered_chunker``) near the best fixed size
(``AutoSizer._taper_sizes``); ``AutoChoice.tapered`` says which cut was chosen. Each plan is a dry run
(``dry_run``: the simulator's engine on the estimate, without its accounting), so the choice
is what a simulator sweep over the candidates finds best for that situation (``benchmarks/auto_sweep.py``
and ``tests/schedule/test_auto_size.py`` check it).

A plan stops early once it cannot be chosen (``_plan_candidates``): the largest sizes, the cheapest to
plan, are planned first, and a smaller one's dry run stops at the makespan past which it would
lose to the best planned to the end so far; its requests still unfinished then end later, so the run's
makespan and mean completion so far are lower bounds. The bounds must show that the candidate
is neither chosen nor the best of either metric, against the candidates planned to the end; a
plan whose bounds do not show it runs to the end. The choice is therefore the one planning
every candidate to the end makes, at a fraction of the work where small sizes cost many
chunks (``tests/schedule/test_auto_stop.py`` compares both). What a stopped plan would have met
after its stop goes unseen: a stall there (a planner bug, which a dry run to the end reports)
no longer fails the choice; the plan of the size chosen always runs to its end.

Only the prompt lengths, the planner's state (``choose_live``) and the cost estimate enter the
choice, never a wall clock, so every rank that sees the same situation computes the same size,
and a recorded choice replays exactly.

``AutoChunker`` is the chunker the controller holds in ``auto`` mode: ``resize(lengths)`` and
``resize_live(planner, arriving)`` (reached through ``Controller.resize`` / ``resize_live``)
pick the size for a situation; until then, or for a request the executor never describes, a
request is cut at the size chosen for it alone.

What ``auto`` sees is one rule for every executor that drives a ``Planner`` (``LiveSituation``):
at each send, the planner's state as it is (the requests in flight with the chunks they were cut
into and the progress they made, each rank's busy time) and the arriving requests at their
arrival time; the candidate size applies to what is cut or batched from then on, which is all a
size chosen now changes (``choose_live``). A closed loop also tells how many requests it will
still send; the plan includes them (``_Replacements``). The first send, to an empty pipeline and
with nothing to come, is ``choose``'s situation: the requests sent together.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from .chunking import Chunker, split_request
from .cost import StageCostModel
from .errors import ChunkingError
from .ir import RequestSpec
from .layout import Layout, LayoutKind
from .dry_run import DryRun
from .planner import Planner
from .policies import PolicySpec
from .factory import ControllerConfig, default_chunker, fills_batches, tapered_chunker

__all__ = ["AUTO", "AUTO_CAP", "LiveSituation", "CANDIDATES", "MAX_PLANNED_CHUNKS", "SERVER_CAP", "WINDOW", "TIE_TOLERANCE", "AutoChoice",
           "AutoSizer", "AutoChunker", "is_auto", "candidates_up_to", "auto_chunker", "score"]

AUTO = "auto"

CANDIDATES = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536)
"""Sizes ``auto`` chooses among: powers of two from the tiny CPU runs' 256 up to the 64K that
long-context serving sweeps, with the 1.5x steps in between from 2K up, where the simulator's
optima lie (an optimum between two steps costs at most a few percent). The steps below 8K
matter where a prompt is short for the pipeline depth: a 64K prompt on 4 or 8 ranks is 8-16
chunks, and one chunk more or less moves fill, drain and host time per forward by several
percent (docs/auto-chunk.md)."""

AUTO_CAP = max(CANDIDATES)
"""The largest size ``auto`` may pick where the executor sets no cap of its own (``simulate``,
``bench``): every candidate. A candidate past the whole situation cuts and batches as the first
one that covers it, so a larger cap than the load plans nothing more."""

MAX_PLANNED_CHUNKS = 2048
"""A candidate that cuts the situation into more chunks than this is not planned (the smallest
candidate above it always is): planning time grows with chunks, and on hardware whose per-chunk
cost is not negligible so many chunks are never best."""

SERVER_CAP = 16384
"""What a server started with ``--chunked-prefill-size auto`` gives SGLang as its chunked-prefill
size (SGLang's default ``--max-prefill-tokens``, so one chunk always fits a prefill batch): the
largest chunk the controller may pick there, and the token budget of a batch of new requests."""

WINDOW = 128
"""Requests of a situation that are planned (the oldest first). A batch's best budget depends
on how many requests share the pipeline (a 16-request window picks 8K for 100 x 4K on CPP at
P = 4 where the 100 requests run best at 16K), so the window covers the paper's 100-request
loads whole; planning 128 requests at every candidate size takes about a second."""

CHUNKER_CACHE = 64
"""Chunkers a ``PerLengthCut`` keeps built, one per prompt length (a server sees a new length
with almost every request; a chunker holds no state between calls, so one rebuilt cuts alike)."""

CHOICE_CACHE = 256
"""Situations an ``AutoSizer`` keeps the answer of (least recently used dropped): a server
meets a new situation at almost every arrival, for its whole lifetime."""

TIE_TOLERANCE = 0.002
"""Scores within this fraction count as equal; the makespan, then the size decides."""

STOP_MARGIN = 1e-6
"""How far past the losing makespan a plan stops, and how far above the best mean completion a
stopped plan's bound must lie (fractions of them): more than the rounding of either bound, whose
mean sums in another order than the full plan's."""


def score(scores: Sequence[tuple[Hashable, float, float]]) -> dict[Hashable, float]:
    """Per candidate of ``(key, makespan, mean completion)``: the larger of its relative losses
    against the smallest makespan and the smallest mean completion among ``scores``."""
    best_makespan = min(m for _, m, _ in scores)
    best_ttft = min(t for _, _, t in scores)
    return {size: max(m / best_makespan, t / best_ttft) - 1.0 for size, m, t in scores}


def is_auto(text: object) -> bool:
    return isinstance(text, str) and text.strip().lower() == AUTO


def candidates_up_to(cap: int | None) -> tuple[int, ...]:
    """The candidates at most ``cap`` tokens (``cap`` itself when it is below all of them)."""
    if cap is None:
        return CANDIDATES
    if cap < 1:
        raise ChunkingError(f"auto chunk size cap must be >= 1 token, got {cap}")
    kept = tuple(c for c in CANDIDATES if c <= cap)
    return kept if kept else (cap,)


@dataclass(frozen=True, slots=True)
class AutoChoice:
    chunk_size: int
    situation: tuple[int, ...]
    """The planned prompt lengths (at most ``WINDOW``, in the order given)."""
    scores: tuple[tuple[int, float, float], ...]
    """(candidate, estimated makespan s, estimated mean completion s) for each candidate planned,
    in size order; for a (candidate, False) in ``stopped``, lower bounds of both."""
    tapered: bool = False
    """The chosen cut is the tapered one at ``chunk_size`` (``AutoSizer.taper_for``)."""
    taper_scores: tuple[tuple[int, float, float], ...] = ()
    """``scores`` of the tapered cuts planned (``AutoSizer._taper_sizes``); bounds for a
    (candidate, True) in ``stopped``."""
    stopped: tuple[tuple[int, bool], ...] = ()
    """(candidate, tapered) of the plans stopped once they could not be chosen (``_plan_candidates``)."""


@dataclass(frozen=True, slots=True)
class PlanScore:
    """A candidate's plan: estimated makespan and mean completion (s, from the situation's start),
    exact when the plan ran to the end, else lower bounds (``AutoSizer._plan_candidates``)."""

    makespan: float
    completion: float
    exact: bool = True


class ScoredRun:
    """A candidate's dry run, scored from ``origin`` on the requests ``counted()`` (indices into the
    planner's requests, read after the run, summed in that order) and the ``to_come()`` it will
    still submit: through a stop (``through``), then on to the end if need be (``to_end``)."""

    def __init__(self, planner: Planner, origin: float, counted: Callable[[], Sequence[int]],
                 to_come: Callable[[], int] = lambda: 0) -> None:
        self.planner = planner
        self.origin = origin
        self.counted = counted
        self.to_come = to_come
        self._run: DryRun | None = None

    def through(self, stop: float | None) -> PlanScore:
        """Run through ``origin + stop`` (None: to the end) and score it. A stopped run's
        unfinished requests end after the stop, so the stop and the ends so far bound both
        metrics from below; a run whose every request ended is exact, and goes on to its end
        (the few events left), where a stall would be reported."""
        until = None if stop is None else self.origin + stop
        if self._run is None:
            self._run = DryRun(self.planner)
            self._run.run(until)
        else:
            self._run.go_on(until)
        finish = self.planner.request_finish
        indices = self.counted()
        ends = [finish[i] - self.origin for i in indices if i in finish]
        unfinished = len(indices) - len(ends)
        if unfinished == 0:
            if self._run.engine.pending:
                self._run.go_on()
            return PlanScore(max(ends), sum(ends) / len(ends))
        assert until is not None, "a dry run to the end finishes every request"
        # Each unfinished request ends after ``until``, so it is at least this far from the
        # origin, rounded as its end will be; while one is unfinished, each completion submits
        # the next of those to come, later still.
        floor = until - self.origin
        missing = unfinished + self.to_come()
        return PlanScore(max([floor, *ends]), (sum(ends) + floor * missing) / (len(ends) + missing), exact=False)

    def to_end(self) -> PlanScore:
        """Go on to the end, exactly as a run never stopped."""
        return self.through(None)


Plan = Callable[[Chunker, int], ScoredRun]
"""(cut, size) -> the plan of the situation with that cut and batch budget, not run yet."""


def _rows(results: dict[tuple[int, bool], PlanScore], *, tapered: bool) -> tuple[tuple[int, float, float], ...]:
    """``AutoChoice.scores`` (or ``taper_scores``) of ``results``: the cuts of one kind, in size order."""
    return tuple((size, s.makespan, s.completion) for (size, taper), s in sorted(results.items()) if taper is tapered)


ChunkerFactory = Callable[[int, int], Chunker]
"""(chunk size, prompt length) -> the mode's chunker at that size for a prompt of that length."""


class AutoSizer:
    """Picks a chunk size (and batch budget) per situation; see the module docstring."""

    def __init__(self, policy: PolicySpec, layout: Layout, cost: StageCostModel, chunker_for: ChunkerFactory, *,
                 max_in_flight: int | None = None, candidates: Sequence[int] = CANDIDATES,
                 window: int = WINDOW, batch: bool = True, taper_for: ChunkerFactory | None = None,
                 partial_fill: bool = False) -> None:
        """``chunker_for``: the mode's chunker at a size (fixed, tapered or the DCPP curve);
        ``batch``: the executor batches whole short requests up to the size (SGLang does);
        ``partial_fill``: and starts the request that overflows in what is left (``choose``'s
        plans; a live plan keeps its planner's controller);
        ``taper_for``: a tapered chunker at a size, weighed beside ``chunker_for``'s near the
        best of those (``_taper_sizes``); None: no tapered candidates."""
        if not candidates or any(not isinstance(c, int) or c < 1 for c in candidates):
            raise ChunkingError(f"auto needs candidate sizes >= 1 token, got {list(candidates)}")
        if window < 1:
            raise ChunkingError(f"auto window must be >= 1 request, got {window}")
        self.policy = policy
        self.layout = layout
        self.cost = cost
        self.chunker_for = chunker_for
        self.max_in_flight = max_in_flight
        self.candidates = tuple(sorted(set(candidates)))
        self.window = window
        self.batch = batch
        self.partial_fill = partial_fill
        self.taper_for = taper_for
        self._cache: OrderedDict[tuple[int, ...], AutoChoice] = OrderedDict()
        """Answers by situation, at most ``CHOICE_CACHE``; a situation planned again is
        answered alike (a plan is a pure function of the situation). Not locked: ``choose``
        runs on one thread at a time (a server plans in its loop only until its first answer,
        then only in its planner process, on a copy of this sizer that keeps its own answers:
        ``plan_process.ProcessPlanner``)."""

    def planned(self, lengths: Sequence[int]) -> tuple[int, ...]:
        """The part of a situation that is planned: its first ``window`` prompt lengths."""
        return tuple(int(n) for n in lengths[: self.window])

    def choose(self, lengths: Sequence[int]) -> AutoChoice:
        """The best candidate for the prompts ``lengths`` (waiting and in flight, oldest first)."""
        situation = self.planned(lengths)
        if not situation or min(situation) < 1:
            raise ChunkingError(f"auto needs prompt lengths >= 1 token, got {list(lengths)[:8]}")
        cached = self._cache.get(situation)
        if cached is not None:
            self._cache.move_to_end(situation)
            return cached

        def plan(chunker: Chunker, size: int) -> ScoredRun:
            return self._plan(chunker, size, situation)

        choice = self._choose(situation, situation, plan)
        self._cache[situation] = choice
        if len(self._cache) > CHOICE_CACHE:
            self._cache.popitem(last=False)
        return choice

    def choose_live(self, planner: Planner, arriving: Sequence[tuple[int, float]], to_come: int = 0) -> AutoChoice:
        """The best candidate for ``arriving`` (prompt length, arrival on the executor's clock),
        planned from where ``planner`` is now: the requests in flight keep the chunks they were
        cut into and the progress they made, the pipeline stays as busy as it is, and only the
        arriving requests' chunks and the batch budget from now on take the candidate size. The
        score is ``choose``'s, on the time left: until the last request of the situation
        completes (makespan) and, on average, until each one does (completion), the requests a
        closed loop sends meanwhile (``to_come``, ``_Replacements``) included."""
        if not arriving or min(length for length, _ in arriving) < 1:
            raise ChunkingError(f"auto needs prompt lengths >= 1 token, got {[n for n, _ in arriving][:8]}")
        arriving = arriving[: self.window]
        done = planner.request_finish
        waiting = [r.length for i, r in enumerate(planner.requests) if i not in done]
        situation = tuple(waiting + [int(length) for length, _ in arriving])
        total = sum(situation)
        now = planner.now

        def plan(chunker: Chunker, size: int) -> ScoredRun:
            follow = _Replacements(min(to_come, len(situation)))
            twin = follow.twin = planner.fork(chunker, size if self.batch else None, follow)
            for length, arrival in arriving:
                twin.submit(RequestSpec(int(length), max(float(arrival), now)))
            # Read after the run: a replacement joins at a completion.
            return ScoredRun(twin, now, lambda: [i for i in range(len(twin.requests)) if i not in done],
                             lambda: follow.count)

        return self._choose(self.planned(situation), [int(length) for length, _ in arriving], plan)

    def _choose(self, situation: tuple[int, ...], cut: Sequence[int], plan: Plan) -> AutoChoice:
        """Plan every candidate size with the mode's chunker, then the tapered cuts near the best
        of those, and pick among all (``_pick``). ``cut``: the prompt lengths the candidate
        cuts (the arriving ones)."""
        results: dict[tuple[int, bool], PlanScore] = {}
        stopped: dict[tuple[int, bool], ScoredRun] = {}
        self._plan_candidates([(size, False) for size in self._planned_sizes(sum(situation))], plan, results, stopped)
        fixed = _rows(results, tapered=False)
        self._plan_candidates([(size, True) for size in self._taper_sizes(fixed, cut)], plan, results, stopped)
        size, tapered = self._pick([(key, s.makespan, s.completion) for key, s in results.items()])
        return AutoChoice(size, situation, _rows(results, tapered=False), tapered, _rows(results, tapered=True),
                          tuple(sorted(stopped)))

    def _plan_candidates(self, keys: Sequence[tuple[int, bool]], plan: Plan,
                         results: dict[tuple[int, bool], PlanScore],
                         stopped: dict[tuple[int, bool], ScoredRun]) -> None:
        """Add to ``results`` a plan of each (size, tapered) of ``keys``, largest first: each stops
        at the makespan past which it loses to the best planned to the end so far (``_stop``),
        and stays stopped (in ``stopped``) only if its bounds show it can be neither chosen nor
        the best of either metric (``_beaten``); else it runs on to the end. Planning more may
        move the best and a bound's verdict with it, so then every stopped plan is checked again
        and runs on to the end where it is no longer beaten: the pick among ``results`` is the
        pick among the same plans all run to the end."""
        for key in sorted(keys, reverse=True):
            make = self.taper_for if key[1] else self.chunker_for
            assert make is not None
            run = plan(PerLengthCut(make, key[0]), key[0])
            result = run.through(self._stop(results))
            if not result.exact and not self._beaten(result, results):
                result = run.to_end()
            results[key] = result
            if not result.exact:
                stopped[key] = run
        while True:
            again = [key for key in stopped if not self._beaten(results[key], results)]
            if not again:
                return
            for key in again:
                results[key] = stopped.pop(key).to_end()

    @staticmethod
    def _bar(results: dict[tuple[int, bool], PlanScore]) -> tuple[float, float, float] | None:
        """Among the plans run to the end: the best makespan, the best mean completion and the
        best loss (``score``); None when none ran to the end yet."""
        exact = [(key, s.makespan, s.completion) for key, s in results.items() if s.exact]
        if not exact:
            return None
        return min(m for _, m, _ in exact), min(t for _, _, t in exact), min(score(exact).values())

    @classmethod
    def _stop(cls, results: dict[tuple[int, bool], PlanScore]) -> float | None:
        """Where a plan stops (s from the situation's start): just past the makespan at which its
        relative loss in makespan alone exceeds the best loss among the plans run to the end
        by more than the tie tolerance (None: none ran to the end yet)."""
        bar = cls._bar(results)
        if bar is None:
            return None
        best_makespan, _, best_loss = bar
        return best_makespan * (1.0 + best_loss + TIE_TOLERANCE) * (1.0 + STOP_MARGIN)

    @classmethod
    def _beaten(cls, bound: PlanScore, results: dict[tuple[int, bool], PlanScore]) -> bool:
        """A stopped plan's lower bounds show, against the plans run to the end, that it is not
        chosen (its loss exceeds the best by more than the tie tolerance) and holds neither
        the best makespan nor the best mean completion, so leaving it out picks alike."""
        bar = cls._bar(results)
        assert bar is not None, "a plan stops only once another ran to the end"
        best_makespan, best_ttft, best_loss = bar
        return (bound.completion >= best_ttft * (1.0 + STOP_MARGIN)
                and bound.makespan / best_makespan - 1.0 > best_loss + TIE_TOLERANCE)

    def _taper_sizes(self, scores: Sequence[tuple[int, float, float]], cut: Sequence[int]) -> list[int]:
        """The sizes whose tapered cut ``auto`` also plans: the best size with the mode's chunker
        and its neighbours among the sizes planned (the taper's body is at most the size, and
        its ends smaller, so its best size lies at or just above the best fixed one), where the
        tapered cut of some prompt of ``cut`` differs from the mode's cut. Planning a taper at
        every size would double the work of a choice."""
        if self.taper_for is None:
            return []
        sizes = [size for size, _, _ in scores]
        best = sizes.index(self._pick([((size, False), m, t) for size, m, t in scores])[0])
        lengths = sorted(set(cut))

        def cuts_otherwise(size: int) -> bool:
            return any(split_request(self.taper_for(size, n), n) != split_request(self.chunker_for(size, n), n)
                       for n in lengths)

        return [size for size in sizes[max(0, best - 1): best + 2] if cuts_otherwise(size)]

    def _planned_sizes(self, total: int) -> list[int]:
        """The candidates worth planning for a situation of ``total`` tokens: none that cuts it into
        more than ``MAX_PLANNED_CHUNKS`` chunks (the largest candidate always stays), and none past
        the first that holds it whole (larger sizes cut and batch exactly like that one)."""
        sizes = []
        for size in self.candidates:
            if -(-total // size) > MAX_PLANNED_CHUNKS and size != self.candidates[-1]:
                continue
            sizes.append(size)
            if size >= total:
                break
        return sizes

    @staticmethod
    def _pick(scores: Sequence[tuple[tuple[int, bool], float, float]]) -> tuple[int, bool]:
        """The (size, tapered) of the best score; ties: the smaller makespan, the smaller size,
        the mode's cut before the tapered one."""
        loss = score(scores)
        best = min(loss.values())
        close = [s for s in scores if loss[s[0]] <= best + TIE_TOLERANCE]
        return min(close, key=lambda s: (s[1], s[0]))[0]

    def _plan(self, chunker: Chunker, size: int, situation: tuple[int, ...]) -> ScoredRun:
        config = ControllerConfig(self.policy, self.layout, chunker, self.cost, self.max_in_flight,
                                  token_budget=size if self.batch else None, partial_fill=self.partial_fill)
        planner = Planner(config, sees_transfers=True)
        for length in situation:
            planner.submit(RequestSpec(length))
        finish = planner.request_finish
        # Summed in completion order: the rounding of the mean, and so the outcome of a close
        # tie, depends on the order.
        return ScoredRun(planner, 0.0, lambda: [*finish, *(i for i in range(len(situation)) if i not in finish)])


class PerLengthCut:
    """A cut at one size as ``auto`` plans and executes it: each request by the chunker built for
    that request's length (a DCPP curve depends on the longest prompt it is fitted to), so a plan
    of mixed lengths cuts every request as the executor will. Keeps the ``CHUNKER_CACHE`` most
    recently used chunkers."""

    def __init__(self, make: ChunkerFactory, size: int) -> None:
        self.size = size
        self._make = make
        self._built: OrderedDict[int, Chunker] = OrderedDict()

    def built(self) -> int:
        """How many chunkers are kept now."""
        return len(self._built)

    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        length = prefix_len + remaining
        chunker = self._built.get(length)
        if chunker is None:
            chunker = self._built[length] = self._make(self.size, length)
            if len(self._built) > CHUNKER_CACHE:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(length)
        return chunker.next_chunk_size(prefix_len, remaining)


class _Replacements:
    """A closed loop's next sends, as ``choose_live`` assumes them: each completion sends one
    request of the completed one's length at that moment, ``count`` times. The lengths to come
    are unknown; a closed loop's in-flight lengths are a sample of them (an assumption, not a
    measurement). ``choose_live`` sends at most as many as the situation holds, one turnover of
    the requests in flight: a chosen horizon, long enough that the arriving request's tail is
    not the plan's drain, short enough to plan in about the time of the situation itself."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.twin: Planner | None = None

    def __call__(self, request_index: int, end: float) -> list[RequestSpec]:
        if self.count <= 0 or self.twin is None:
            return []
        self.count -= 1
        return [RequestSpec(self.twin.requests[request_index].length, end)]


class AutoChunker:
    """The controller's chunker in ``auto`` mode (module docstring)."""

    def __init__(self, sizer: AutoSizer) -> None:
        self.sizer = sizer
        self.choice: AutoChoice | None = None
        self.history: list[AutoChoice] | None = []
        """Every choice made, in order (a simulation reports them); None keeps none (a server,
        which meets a new situation at almost every arrival for its whole lifetime, records
        them in its trace instead)."""
        self.on_choice: Callable[..., None] | None = None
        """Called with ``prefix``, ``remaining`` and ``size`` after every ``next_chunk_size``
        (an executor that records decisions for ``check --trace``)."""
        self._cut: tuple[tuple[int, bool], PerLengthCut] | None = None
        """The cut of the choice in force, keyed by its (size, tapered)."""

    def resize(self, lengths: Sequence[int]) -> AutoChoice:
        return self._chose(self.sizer.choose(lengths))

    def adopt(self, lengths: Sequence[int], size: int, tapered: bool = False) -> AutoChoice:
        """The cut another replica of this chunker chose for ``lengths`` with ``resize`` (its
        size, and whether tapered): a pipeline's rank 0 plans, the other ranks take its answer
        instead of planning again (``check --trace`` plans every recorded one again).
        ChunkingError for a size that is not a candidate, or a tapered cut this mode never plans."""
        if size not in self.sizer.candidates:
            raise ChunkingError(f"auto size {size} is not one of the candidates {list(self.sizer.candidates)}")
        if tapered and self.sizer.taper_for is None:
            raise ChunkingError(f"a tapered auto cut at {size} for a mode whose auto weighs no tapered cut")
        return self._chose(AutoChoice(int(size), self.sizer.planned(lengths), (), bool(tapered)))

    def resize_live(self, planner: Planner, arriving: Sequence[tuple[int, float]], to_come: int = 0) -> AutoChoice:
        """``resize`` for requests arriving at a running planner (``AutoSizer.choose_live``)."""
        return self._chose(self.sizer.choose_live(planner, arriving, to_come))

    def _chose(self, choice: AutoChoice) -> AutoChoice:
        self.choice = choice
        if self.history is not None:
            self.history.append(choice)
        return choice

    def size_for(self, length: int) -> int:
        """The chunk size a ``length``-token request is cut at now."""
        return self._choice_for(length).chunk_size

    def _choice_for(self, length: int) -> AutoChoice:
        return self.choice if self.choice is not None else self.sizer.choose((length,))

    def cut_in_force(self, length: int) -> PerLengthCut:
        """The cut a ``length``-token request gets now (built once per choice)."""
        choice = self._choice_for(length)
        key = (choice.chunk_size, choice.tapered)
        if self._cut is None or self._cut[0] != key:
            make = self.sizer.taper_for if choice.tapered else self.sizer.chunker_for
            assert make is not None
            self._cut = (key, PerLengthCut(make, choice.chunk_size))
        return self._cut[1]

    def next_chunk_size(self, prefix_len: int, remaining: int) -> int:
        cut = self.cut_in_force(prefix_len + remaining).next_chunk_size(prefix_len, remaining)
        if self.on_choice is not None:
            self.on_choice(prefix=prefix_len, remaining=remaining, size=cut)
        return cut


@dataclass(frozen=True)
class ModeChunkers:
    """``default_chunker``'s chunker for the mode at a size: the ``chunker_for`` of ``auto_chunker``.
    A module-level value, not a closure, so a sizer pickles whole (a server plans in a child
    process: ``sglang_vpp/plan_process.py``)."""

    policy: PolicySpec
    layout: Layout
    cost: StageCostModel

    def __call__(self, size: int, max_length: int) -> Chunker:
        return default_chunker(self.policy, size, self.layout, self.cost, max_length)


@dataclass(frozen=True)
class TaperedChunkers:
    """vpp-taper's cut at a size: the ``taper_for`` of ``auto_chunker`` (pickles, as above)."""

    layout: Layout

    def __call__(self, size: int, max_length: int) -> Chunker:
        return tapered_chunker(size, self.layout)


def auto_chunker(policy: PolicySpec, layout: Layout, cost: StageCostModel, cap: int | None = None, *,
                 max_in_flight: int | None = None, chunker_for: ChunkerFactory | None = None,
                 batch: bool = True, taper: bool = True, partial_fill: bool | None = None) -> AutoChunker:
    """An ``auto`` chunker choosing among the candidates up to ``cap`` tokens (the executor's
    largest forward); ``chunker_for`` defaults to ``default_chunker``'s chunker for the mode, and
    then, with ``taper``, a fold-back mode with fixed chunks also weighs vpp-taper's cut
    (``tapered_chunker``). ``partial_fill``: whether the batches it plans (``batch``) start the
    request that overflows them (None: ``fills_batches``)."""
    taper_for: ChunkerFactory | None = None
    if chunker_for is None:
        chunker_for = ModeChunkers(policy, layout, cost)
        if taper and layout.kind is LayoutKind.FOLDBACK and not policy.tapered_chunks and not policy.dynamic_chunks:
            taper_for = TaperedChunkers(layout)
    sizer = AutoSizer(policy, layout, cost, chunker_for, max_in_flight=max_in_flight,
                      candidates=candidates_up_to(cap), batch=batch, taper_for=taper_for,
                      partial_fill=fills_batches(partial_fill, batch))
    return AutoChunker(sizer)


class LiveSituation:
    """The situation ``auto`` is asked about (module docstring): an executor that drives a
    ``Planner`` reports each send; the controller's ``auto`` chunker then sizes the arriving
    requests from the planner's state (``AutoSizer.choose_live``). A controller whose chunker is
    not ``auto`` ignores it (``Controller.resize_live``)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def sent(self, requests: Sequence[RequestSpec], to_come: int = 0) -> int | None:
        """``requests`` (length, arrival on the executor's clock) were sent, before they are
        submitted; an arrival before the planner's present counts as the present. ``to_come``:
        how many more requests a closed loop will send, one per completion (0: unknown or
        none). Returns the size chosen."""
        return self.planner.controller.resize_live(self.planner, [(r.length, r.arrival) for r in requests],
                                                   to_come)
