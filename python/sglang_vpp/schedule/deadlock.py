"""The deadlock checker: a dry run of per-rank streams under rendezvous semantics.

Model (the strictest of gloo, NCCL and HCCL, per ``docs/comm.md``):

- Each rank executes its actions in order. A compute always completes.
- A communicator is a group on an unordered pair of ranks. Each rank's operations on a
  communicator form one in-order queue; the i-th operation on one end pairs with the i-th on the
  other (HCCL: strict order, in pairs). Two heads that are not a send and its receive never pair.
- A receive holds its rank until it pairs. A send holds its rank too under ``blocking``
  semantics; under ``async`` it is posted and the rank goes on (it still pairs in order).

If some rank cannot finish, the report lists who waits on whom and the cycle in that graph
(each blocked rank waits on the peer of the operation it is stuck at).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .ir import Action, ActionKind
from .policies import CommSemantics
from .text import format_grid

__all__ = ["DeadlockReport", "check_deadlock"]


@dataclass
class DeadlockReport:
    deadlock: bool
    cycle: list[dict] = field(default_factory=list)
    blocked: list[dict] = field(default_factory=list)
    actions: int = 0

    def to_dict(self) -> dict:
        return {"deadlock": self.deadlock, "cycle": self.cycle, "blocked": self.blocked, "actions": self.actions}

    def describe(self, rank_actions) -> str:
        if not self.deadlock:
            return "no deadlock"
        lines = ["deadlock: " + " -> ".join(f"rank {w['rank']} ({w['action']})" for w in self.cycle)
                 if self.cycle else "deadlock: ranks blocked with no cycle (an operation has no partner)"]
        for wait in self.blocked:
            lines.append(f"  rank {wait['rank']} step {wait['step']}: {wait['action']} waits for rank "
                         f"{wait['waits_for']} ({wait['reason']})")
        if self.blocked:
            first = self.blocked[0]
            lines.append(format_grid(rank_actions, (first["rank"], max(first["step"], 0))))
        return "\n".join(lines)


def _pairs(a: Action, b: Action) -> bool:
    kinds = {a.kind, b.kind}
    return kinds == {ActionKind.SEND, ActionKind.RECV} and a.key == b.key


def check_deadlock(schedule=None, *, rank_actions=None, comm_semantics=None) -> DeadlockReport:
    """Dry-run ``schedule`` (or explicit ``rank_actions`` + ``comm_semantics``)."""
    if schedule is not None:
        rank_actions = schedule.rank_actions
        comm_semantics = schedule.comm_semantics
    semantics = CommSemantics(comm_semantics)
    num_ranks = len(rank_actions)
    pc = [0] * num_ranks
    posted = [-1] * num_ranks  # highest step posted to a channel queue
    completed: set[tuple[int, int]] = set()
    queues: dict[tuple[str, int, int], dict[int, deque]] = {}

    def queue(rank: int, action: Action) -> deque:
        key = (action.group, min(rank, action.peer), max(rank, action.peer))
        sides = queues.setdefault(key, {key[1]: deque(), key[2]: deque()})
        return sides[rank]

    progress = True
    while progress:
        progress = False
        for rank in range(num_ranks):
            actions = rank_actions[rank]
            while pc[rank] < len(actions):
                step = pc[rank]
                action = actions[step]
                if action.kind is ActionKind.COMPUTE:
                    pc[rank] += 1
                    progress = True
                    continue
                if posted[rank] < step:
                    queue(rank, action).append((step, action))
                    posted[rank] = step
                    progress = True
                holds = action.kind is ActionKind.RECV or semantics is CommSemantics.BLOCKING
                if holds and (rank, step) not in completed:
                    break
                pc[rank] += 1
                progress = True
        for (_, low, high), sides in queues.items():
            a_side, b_side = sides[low], sides[high]
            while a_side and b_side and _pairs(a_side[0][1], b_side[0][1]):
                completed.add((low, a_side.popleft()[0]))
                completed.add((high, b_side.popleft()[0]))
                progress = True

    total = sum(len(a) for a in rank_actions)
    blocked = []
    waits_for: dict[int, dict] = {}
    for rank in range(num_ranks):
        if pc[rank] < len(rank_actions[rank]):
            step = pc[rank]
            action = rank_actions[rank][step]
            reason = _reason(rank, action, queues)
            waits_for[rank] = {"rank": rank, "step": step, "action": str(action),
                               "waits_for": action.peer, "reason": reason}
    for sides in queues.values():
        for rank, pending in sides.items():
            if pending and rank not in waits_for:
                step, action = pending[0]
                waits_for[rank] = {"rank": rank, "step": step, "action": str(action), "waits_for": action.peer,
                                   "reason": "posted send never paired"}
    blocked = [waits_for[r] for r in sorted(waits_for)]
    return DeadlockReport(bool(blocked), _find_cycle(waits_for), blocked, total)


def _reason(rank: int, action: Action, queues) -> str:
    key = (action.group, min(rank, action.peer), max(rank, action.peer))
    sides = queues.get(key)
    if not sides:
        return "not posted"
    mine, theirs = sides[rank], sides[action.peer]
    if mine and mine[0][1] != action:
        return f"queued behind {mine[0][1]} on group {action.group}"
    if theirs:
        return f"peer's head on group {action.group} is {theirs[0][1]}, which does not pair with it"
    return f"peer has posted nothing on group {action.group}"


def _find_cycle(waits_for: dict[int, dict]) -> list[dict]:
    for start in waits_for:
        seen: list[int] = []
        node = start
        while node in waits_for and node not in seen:
            seen.append(node)
            node = waits_for[node]["waits_for"]
        if node in seen:
            return [waits_for[n] for n in seen[seen.index(node):]]
    return []
