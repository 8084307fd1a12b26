"""Constrained decoding under VPP: rank 0's grammar-readiness decision rides on its event log.

A request with a ``regex``, ``json_schema``, ``ebnf`` or structural tag (OpenAI
``response_format``, tool calls with a required choice) waits in SGLang's grammar queue while every
rank compiles its grammar in a thread pool, so one rank may find it ready before another. Stock
pipeline parallelism makes the ranks agree by sending pp rank 0's decision (which queued requests
are ready, which timed out) to the next rank at every scheduling call that finds a request
waiting (``GrammarManager._pp_sync_ready_failed``): a point-to-point send on SGLang's PP group,
matched by a receive in the next rank's same call. That pairing needs the ranks to schedule in
lockstep. Under VPP they do not: rank 0 schedules ahead (a free slot is tried at every step, and
a turn over the slots may call twice) and its followers replay the decisions only when its
events reach them with the hidden states, so rank 0's second send waits for a receive that comes
only after rank 0's next message: the server hangs until the pipeline's timeout ends it.

So under VPP the decision travels as every other scheduling input does: rank 0's call logs
``("grammar", ready, failed, rids)`` just before the ``"sched"`` event of the same call, and a follower
replaying the log queues it for its own call of that ``"sched"`` event. The stock send and
receive never run. The TP ranks of pp rank 0 still agree among themselves through SGLang's own
all-gather, which runs before this point; every follower then compiles (waits for) the grammar
of each request rank 0 found ready, as in stock PP. While a request waits on its grammar rank 0's
loop does not go idle (``event_loop.LeaderLoop._build``): idle waits for a new request, and a
finished compile is none. Each turn of the loop then calls SGLang's scheduler once per free slot
(each call polls the compile for up to ``SGLANG_GRAMMAR_POLL_INTERVAL``, 5 ms by default) and
sends the followers one control message of those calls' events, as stock PP sends one message
per call: a cost paid only while a grammar compiles.

    constrained.grammar_manager.GrammarManager._pp_sync_ready_failed  AROUND  (the stock p2p never runs)
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

from .errors import SchedulerDivergenceError

__all__ = ["GRAMMAR_PP_SYNC", "GrammarDecisions", "around_pp_sync_ready_failed", "install_grammar_decisions"]

GRAMMAR_PP_SYNC = "sglang.srt.constrained.grammar_manager.GrammarManager._pp_sync_ready_failed"

Decision = tuple[list[int], list[int], list[str]]
"""Indexes into the grammar queue (ready, failed; sorted, so the event pickles the same way
everywhere) and the rids at those indexes, which a follower checks against its own queue."""


def _rids_at(grammar_manager: Any, ready: set[int], failed: set[int]) -> list[str]:
    queue = grammar_manager.grammar_queue
    return [str(queue[i].rid) if 0 <= i < len(queue) else "<none>" for i in sorted(ready | failed)]


class GrammarDecisions:
    """This rank's side of the decision: rank 0 logs it, a follower takes the logged one."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.logged: list[tuple] = []
        """Rank 0: the events of the scheduling call in progress (``take`` moves them to the log)."""
        self.queued: deque[Decision] = deque()
        """A follower: rank 0's decisions, replayed but not yet taken by a scheduling call."""

    def decide(self, grammar_manager: Any, ready: set[int], failed: set[int]) -> tuple[set[int], set[int]]:
        if self.rank == 0:
            self.logged.append(("grammar", sorted(ready), sorted(failed), _rids_at(grammar_manager, ready, failed)))
            return ready, failed
        if not self.queued:
            raise SchedulerDivergenceError(
                f"VPP rank {self.rank}: a replayed scheduling call found a request waiting on its grammar, "
                "but rank 0's log carries no grammar decision for it. The replicated schedulers "
                "diverged; report this with the server log."
            )
        ready_list, failed_list, rids = self.queued.popleft()
        decided = set(ready_list), set(failed_list)
        own = _rids_at(grammar_manager, *decided)
        if own != rids:
            raise SchedulerDivergenceError(
                f"VPP rank {self.rank}: rank 0 decided on the grammars of requests {rids}, but this rank's "
                f"grammar queue holds {own} at those places. The replicated schedulers diverged; report "
                "this with the server log."
            )
        return decided

    def take(self) -> list[tuple]:
        """Rank 0: the decisions of the call just made, to log before its ``"sched"`` event."""
        logged, self.logged = self.logged, []
        return logged

    def replay(self, event: tuple) -> None:
        _, ready, failed, rids = event
        self.queued.append((list(ready), list(failed), list(rids)))

    def check_taken(self, num_events: int) -> None:
        """A follower after replaying a ``"sched"`` event: every decision logged for it was used."""
        if self.queued:
            raise SchedulerDivergenceError(
                f"VPP rank {self.rank}: replayed scheduling decision {num_events} left {len(self.queued)} of "
                "rank 0's grammar decisions unused (this rank's grammar queue differs from rank 0's). "
                "The replicated schedulers diverged; report this with the server log."
            )


_decisions: GrammarDecisions | None = None


def install_grammar_decisions(rank: int) -> GrammarDecisions:
    """The decisions object the hook uses in this scheduler process (one VPP loop per process)."""
    global _decisions
    _decisions = GrammarDecisions(rank)
    return _decisions


def around_pp_sync_ready_failed(original: Callable[..., Any], grammar_manager: Any, ready: set[int],
                                failed: set[int], *args: Any, **kwargs: Any) -> tuple[set[int], set[int]]:
    if _decisions is None:  # no VPP loop in this process yet: nothing schedules before it starts
        return original(grammar_manager, ready, failed, *args, **kwargs)
    return _decisions.decide(grammar_manager, ready, failed)
