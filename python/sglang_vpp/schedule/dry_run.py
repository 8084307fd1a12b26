"""The planner's dry run: the engine (``engine.py``) executing what the planner emits, on the
controller's own estimates.

Nothing is planned on a clock of the planner's own: ``build_schedule`` (the ``schedule`` and
``check`` commands), ``auto``'s what-ifs
(``auto_size``: a situation from an empty pipeline, or a fork of a running planner) and the
simulator (``sim/engine.py``, with a hardware cost model and its accounting) run one engine, so
a dry run on the simulator's durations decides exactly as the simulation does
(``tests/sim/test_one_clock.py``).
"""

from __future__ import annotations

from typing import Sequence

from .chunking import Chunker
from .cost import StageCostModel
from .deadlock import DeadlockReport
from .engine import Engine
from .errors import ScheduleError
from .factory import controller_config, policy_layout
from .ir import RequestSpec
from .layout import Fold
from .planner import Planner
from .policies import Policy, PolicySpec, get_policy
from .schedule import Schedule, schedule_from_planner

__all__ = ["DryRun", "build_schedule", "dry_run"]


class DryRun:
    """A planner's dry run that can stop at a time and go on: ``run(until)``; what is submitted
    to the planner in between runs too (a what-if forked mid-run, a test)."""

    def __init__(self, planner: Planner, durations: StageCostModel | None = None, *,
                 allow_deadlock: bool = False) -> None:
        """``planner``: a fresh one, built with ``sees_transfers=True``, or a ``Planner.fork``;
        ``durations``: how long each action takes (None: the controller's estimate,
        ``config.cost``). ``allow_deadlock``: streams that deadlock by themselves (hand-offs of
        both directions on one group pair out of order: the checker's negative control) end the
        run with their report instead of an error."""
        self.planner = planner
        self.allow_deadlock = allow_deadlock
        self.engine = Engine(None, durations if durations is not None else planner.config.cost, planner=planner)

    def run(self, until: float | None = None) -> DeadlockReport | None:
        """Run through ``until`` (None: to the end). Returns None, or (``allow_deadlock``) the
        deadlock of the streams emitted. ScheduleError for any other stall: work the planner
        cannot place (a controller that never admits it) names the planner's state."""
        return self._checked(self.engine.execute(until))

    def go_on(self, until: float | None = None) -> DeadlockReport | None:
        """``run`` on from where a run through an earlier ``until`` stopped, exactly as if it had
        not stopped: for a run nothing was submitted to since (``Engine.go_on``)."""
        return self._checked(self.engine.go_on(until))

    def _checked(self, stall: DeadlockReport | None) -> DeadlockReport | None:
        if stall is None or (self.allow_deadlock and self.engine.streams_deadlock):
            return stall
        why = "the streams deadlock" if self.engine.streams_deadlock else "no rank can go on"
        raise ScheduleError(f"the dry run stalled ({why}): {self.planner.stuck_state()}")


def dry_run(planner: Planner, durations: StageCostModel | None = None, *,
            allow_deadlock: bool = False) -> DeadlockReport | None:
    """Run everything submitted to ``planner`` (more may follow from its completion callback) to
    the end: ``DryRun(planner, durations, allow_deadlock=...).run()``."""
    return DryRun(planner, durations, allow_deadlock=allow_deadlock).run()


def build_schedule(
    policy: str | Policy | PolicySpec,
    num_ranks: int,
    num_layers: int,
    requests: Sequence[RequestSpec | int],
    chunk_size: int,
    split: Sequence[int] | None = None,
    cost: StageCostModel | None = None,
    chunker: Chunker | None = None,
    num_groups: int | None = None,
    max_in_flight: int | None = None,
    batching: bool = False,
    fold: Fold | str = Fold.SPLIT,
    partial_fill: bool | None = None,
) -> Schedule:
    """Plan ``requests`` (lengths or ``RequestSpec``) end to end for one policy by a dry run.
    ``batching`` off by default: one request per forward, the reference runtime's
    ``--no-batch-requests`` (``factory.controller_config``); the runtime's default batches, as
    ``batching=True`` plans. ``fold``: a fold-back mode's fold (``factory.policy_layout``).
    ``partial_fill``: with ``batching``, a batch starts the request that overflows it
    (``ControllerConfig.partial_fill``); None: whenever ``batching``; told to without ``batching``
    it is refused."""
    spec = policy if isinstance(policy, PolicySpec) else get_policy(policy)
    layout = policy_layout(spec, num_ranks, num_layers, split, fold)
    specs = [r if isinstance(r, RequestSpec) else RequestSpec(int(r)) for r in requests]
    config = controller_config(spec, layout, chunk_size, cost, max((r.length for r in specs), default=1),
                               batching=batching, max_in_flight=max_in_flight, num_groups=num_groups,
                               chunker=chunker, partial_fill=partial_fill)
    planner = Planner(config, sees_transfers=True)
    for request in specs:
        planner.submit(request)
    # The streams of a deadlocking configuration are what ``check`` reports on.
    dry_run(planner, allow_deadlock=True)
    return schedule_from_planner(planner)
