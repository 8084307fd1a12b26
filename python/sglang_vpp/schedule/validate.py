"""The validator: is a schedule complete, causal and consistently paired?

Checks, each reported with rank, step, expected against actual, and the rank x step grid:

1. Placement: every compute runs on the rank that owns its stage; every send leaves the producing
   stage's rank for the next stage's rank, every receive arrives there, on a group the schedule
   declares, in that group's direction (``fwd`` up the ranks, ``bwd`` down).
2. Completeness: every stage of every chunk runs exactly once; nothing runs that is not a chunk.
3. Causality (program order on each rank): a compute's input is produced earlier (the previous
   stage locally, or received earlier); its KV prefix (the previous chunk of the same request on
   the same stage, perhaps a head batched in another request's forward) was computed earlier; a
   send follows the compute that produced it.
4. Pairing: every cross-rank hand-off has exactly one send and one receive on the same group, and
   per group and direction the order of sends on one end equals the order of receives on the other.

How sends and receives interleave on a shared communicator is the deadlock checker's job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .errors import ScheduleError
from .ir import GROUP_BACKWARD, GROUP_FORWARD, Action, ActionKind
from .text import format_grid

__all__ = ["ValidationIssue", "find_issues", "validate_schedule"]


@dataclass(frozen=True, slots=True)
class ValidationIssue:
    rank: int
    step: int
    message: str

    def to_dict(self) -> dict:
        return {"rank": self.rank, "step": self.step, "message": self.message}


def validate_schedule(schedule) -> None:
    """Raise ``ScheduleError`` for the first problem found, with the grid marked."""
    issues = find_issues(schedule)
    if issues:
        first = issues[0]
        more = f" ({len(issues) - 1} more problems)" if len(issues) > 1 else ""
        raise ScheduleError(
            f"invalid {schedule.policy} schedule at rank {first.rank}, step {first.step}: "
            f"{first.message}{more}\n{format_grid(schedule.rank_actions, (first.rank, first.step))}"
        )


def find_issues(schedule, limit: int = 50) -> list[ValidationIssue]:
    layout = schedule.layout
    chunk_keys = {c.key for c in schedule.chunks}
    # The other requests' chunks that ride in each batched forward run when its lead runs.
    batched = {c.key: tuple(part.key for part in c.batch) for c in schedule.chunks if c.batch}
    issues: list[ValidationIssue] = []
    computed: dict[tuple[int, int, int], int] = {}
    sends: dict[tuple[str, int, int], list[tuple[int, int, int]]] = defaultdict(list)
    recvs: dict[tuple[str, int, int], list[tuple[int, int, int]]] = defaultdict(list)

    def report(rank: int, step: int, message: str) -> None:
        issues.append(ValidationIssue(rank, step, message))

    for rank, actions in enumerate(schedule.rank_actions):
        done: set[tuple[int, int, int]] = set()
        received: set[tuple[int, int, int]] = set()
        sent: set[tuple[int, int, int]] = set()
        for step, action in enumerate(actions):
            if len(issues) >= limit:
                return issues
            stage = action.stage_index
            if stage >= layout.num_stages:
                report(rank, step, f"{action}: stage {stage} does not exist (layout has {layout.num_stages})")
                continue
            if action.chunk_key not in chunk_keys:
                report(rank, step, f"{action}: request {action.request_index} has no chunk {action.chunk_index}")
                continue
            if action.kind is ActionKind.COMPUTE:
                _check_compute(layout, rank, step, action, done, received, computed, report)
                done.update((stage, *key) for key in batched.get(action.chunk_key, ()))
            else:
                _check_comm(schedule, rank, step, action, done, sent, received, sends, recvs, report)
    for chunk in schedule.chunks:
        for stage in range(layout.num_stages):
            if (stage, *chunk.key) not in computed:
                report(layout.rank_of(stage), -1,
                       f"stage {stage} of request {chunk.request_index} chunk {chunk.chunk_index} never runs "
                       f"(expected {stage}F{chunk.request_index}.{chunk.chunk_index} on rank {layout.rank_of(stage)})")
    for channel in set(sends) | set(recvs):
        out, into = sends.get(channel, []), recvs.get(channel, [])
        if [k for k, _, _ in out] != [k for k, _, _ in into]:
            group, src, dst = channel
            position = next((i for i, (a, b) in enumerate(zip(out, into)) if a[0] != b[0]), min(len(out), len(into)))
            expected = out[position][0] if position < len(out) else None
            actual = into[position][0] if position < len(into) else None
            step = into[position][2] if position < len(into) else -1
            report(dst, step,
                   f"group {group} {src}->{dst}: hand-off #{position} sends {expected} but receives {actual}; "
                   "both ends must list the same tensors in the same order")
    return issues


def _check_compute(layout, rank, step, action: Action, done, received, computed, report) -> None:
    stage, request, chunk = action.key
    owner = layout.rank_of(stage)
    if owner != rank:
        report(rank, step, f"{action}: stage {stage} belongs to rank {owner}, not rank {rank}")
    if action.key in computed:
        report(rank, step, f"{action} runs twice (first on rank {computed[action.key]})")
    computed[action.key] = rank
    if stage > 0:
        producer = (stage - 1, request, chunk)
        local = layout.rank_of(stage - 1) == rank
        if local and producer not in done:
            report(rank, step, f"{action}: input {stage - 1}F{request}.{chunk} has not run on this rank yet")
        if not local and producer not in received:
            report(rank, step, f"{action}: input of stage {stage - 1} not received yet "
                               f"(expected {stage - 1}RECV_F{request}.{chunk} earlier on rank {rank})")
    if chunk > 0 and (stage, request, chunk - 1) not in done:
        report(rank, step, f"{action}: KV prefix {stage}F{request}.{chunk - 1} has not run yet on this stage")
    done.add(action.key)


def _check_comm(schedule, rank, step, action: Action, done, sent, received, sends, recvs, report) -> None:
    layout = schedule.layout
    stage = action.stage_index
    if stage >= layout.num_stages - 1:
        report(rank, step, f"{action}: the last stage's output is not handed to another stage")
        return
    src, dst = layout.rank_of(stage), layout.rank_of(stage + 1)
    if src == dst:
        report(rank, step, f"{action}: stages {stage} and {stage + 1} share rank {src}; no hand-off is needed")
        return
    expected_self, expected_peer = (src, dst) if action.kind is ActionKind.SEND else (dst, src)
    if (rank, action.peer) != (expected_self, expected_peer):
        report(rank, step, f"{action}: expected on rank {expected_self} with peer {expected_peer}, "
                           f"got rank {rank} peer {action.peer}")
        return
    if action.group not in schedule.groups:
        report(rank, step, f"{action}: group {action.group!r} is not one of this schedule's groups {schedule.groups}")
    wrong_way = (action.group == GROUP_FORWARD and dst < src) or (action.group == GROUP_BACKWARD and dst > src)
    if wrong_way:
        report(rank, step, f"{action}: group {action.group} carries the other direction ({src}->{dst})")
    channel = (action.group, src, dst)
    if action.kind is ActionKind.SEND:
        if action.key not in done:
            report(rank, step, f"{action}: sends output of {stage}F{action.request_index}.{action.chunk_index} "
                               "before computing it")
        if action.key in sent:
            report(rank, step, f"{action}: sent twice")
        sent.add(action.key)
        sends[channel].append((action.key, rank, step))
    else:
        if action.key in received:
            report(rank, step, f"{action}: received twice")
        received.add(action.key)
        recvs[channel].append((action.key, rank, step))
