"""Idle by cause: why each rank's device was not computing or communicating.

A rank's bubble (``makespan - compute - exposed comm``, docs/metrics.md) is the sum of intervals
that each have one mechanism behind them. The engine reports every interval it creates to an
``IdleLedger``; nothing here is a fitted share of anything, so a mode that lacks a mechanism
(no blocking sends, no admission window, fewer micro-batches) pays nothing for it.

Causes (``IdleCause``):

- ``fill``: before the rank's first compute, waiting for the first chunk to reach it;
- ``upstream_wait``: a receive whose data a neighbour has not produced yet, after the rank has
  started: stage imbalance (an uneven layer split, chunk cost growing with the prefix, a
  neighbour that holds two stages);
- ``rendezvous``: a blocking send held until the receiver posts its receive (and until the
  previous transfer on the same ordered communicator has ended);
- ``admission``: stage 0 waiting for a micro-batch slot to come back from the last stage;
- ``release``: stage 0 waiting for a request to arrive (or for its closed-loop client);
- ``scheduling_gap``: host time per micro-batch (scheduler iteration, batch set-up) during
  which the device idles: the cost model's ``StageTime.overhead_s``;
- ``drain``: after the rank's last action, until the last rank finishes;
- ``other``: whatever the intervals above do not cover (zero for the engine's semantics; kept
  so that the causes always add up to the bubble).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["IdleCause", "IdleLedger", "IDLE_CAUSES", "ROUNDING"]


class IdleCause(StrEnum):
    FILL = "fill"
    UPSTREAM_WAIT = "upstream_wait"
    RENDEZVOUS = "rendezvous"
    ADMISSION = "admission"
    RELEASE = "release"
    SCHEDULING_GAP = "scheduling_gap"
    DRAIN = "drain"
    OTHER = "other"


IDLE_CAUSES: tuple[str, ...] = tuple(str(c) for c in IdleCause)

ROUNDING = 1e-9
"""A relative difference below this is float rounding of sums taken in another order."""


class IdleLedger:
    """Per-rank idle seconds by cause, built from the engine's intervals in time order.

    Each rank has a cursor: the time up to which its track is accounted. A gap between the
    cursor and the start of the next interval is charged to the reason the engine gave when the
    rank stopped (``stopped``), or to ``other`` when it gave none.
    """

    def __init__(self, num_ranks: int, start: float = 0.0) -> None:
        """``start``: where the accounting begins (the first arrival): no rank idles before it."""
        self.start = start
        self.cursor = [start] * num_ranks
        self.started = [False] * num_ranks
        self.reason: list[IdleCause | None] = [None] * num_ranks
        self.idle: list[dict[str, float]] = [dict.fromkeys(IDLE_CAUSES, 0.0) for _ in range(num_ranks)]

    def _charge(self, rank: int, cause: IdleCause, seconds: float) -> None:
        if seconds > 0:
            if not self.started[rank] and cause is IdleCause.UPSTREAM_WAIT:
                cause = IdleCause.FILL
            self.idle[rank][cause] += seconds

    def _catch_up(self, rank: int, start: float) -> None:
        gap = start - self.cursor[rank]
        self._charge(rank, self.reason[rank] or IdleCause.OTHER, gap)
        self.reason[rank] = None

    def stopped(self, rank: int, cause: IdleCause) -> None:
        """``rank`` cannot issue its next action until later, because of ``cause``."""
        self.reason[rank] = cause

    def compute(self, rank: int, start: float, end: float, host_overhead_s: float) -> None:
        """A stage compute on ``[start, end]``; ``host_overhead_s`` of it leaves the device idle."""
        self._catch_up(rank, start)
        self.started[rank] = True
        self._charge(rank, IdleCause.SCHEDULING_GAP, host_overhead_s)
        self.cursor[rank] = max(self.cursor[rank], end)

    def wait(self, rank: int, start: float, end: float, idle_s: float, cause: IdleCause) -> None:
        """A comm action held ``rank`` on ``[start, end]``; ``idle_s`` of it was not communication."""
        self._catch_up(rank, start)
        # A wait posted before the first arrival was idle up to it: no data existed yet.
        self._charge(rank, cause, idle_s - max(0.0, min(end, self.start) - start))
        self.cursor[rank] = max(self.cursor[rank], end)

    def finish(self, rank: int, makespan: float, bubble_s: float) -> dict[str, float]:
        """The rank's idle by cause over ``[start, makespan]``; ``other`` closes the sum to ``bubble_s``."""
        idle = self.idle[rank]
        idle[IdleCause.DRAIN] += max(0.0, makespan - self.cursor[rank])
        named = sum(v for k, v in idle.items() if k != IdleCause.OTHER)
        other = bubble_s - named
        # The causes add up the same gaps as bubble_s in another order: a rest within rounding is none.
        idle[IdleCause.OTHER] = 0.0 if abs(other) < ROUNDING * max(1.0, abs(bubble_s)) else other
        return {str(k): v for k, v in idle.items()}
