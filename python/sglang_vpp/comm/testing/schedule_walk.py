"""Execute one rank's action list of a schedule-core ``Schedule`` on a real communicator.

The walk is the runtime's communication pattern without the model: COMPUTE turns the input of a
stage into its output with a cheap exact function, SEND posts the output to the peer on the
action's group, RECV waits for it and checks that it is exactly what the producing stage computed
for that (request, chunk). So a run that completes proves both progress (no deadlock on this
backend) and delivery (every activation arrived, unchanged, at the right place).

Payload of the output of stage ``s`` for ``(request r, chunk c)``, the shape of a runtime message:
``hidden_states`` float32 ``[rows, hidden]`` equal to ``base(r, c) + sum(k + 1 for k <= s)``,
``residual`` bfloat16 of the same shape, ``positions`` int64 ``[rows]`` and metadata
``{"key": [s, r, c]}``; ``rows = 1 + c % 4`` varies shapes between messages.

``semantics``: ``"async"`` posts sends and goes on (vpp-async), ``"blocking"`` waits for each send
(what a blocking ``send`` in the stock pipeline does). ``group_map`` rewrites group names, e.g.
``{"fwd": "pp", "bwd": "pp"}`` runs a dual-group schedule on one group: the negative control.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ..base import CommHandle, PipelineCommunicator

__all__ = ["WalkReport", "walk_rank", "stage_output", "HIDDEN"]

HIDDEN = 8


def stage_output(stage: int, request: int, chunk: int) -> dict[str, Any]:
    """The exact message the producing stage sends for (request, chunk)."""
    rows = 1 + chunk % 4
    value = float(request * 1000 + chunk) + sum(k + 1 for k in range(stage + 1))
    hidden = torch.full((rows, HIDDEN), value, dtype=torch.float32)
    return {
        "hidden_states": hidden,
        "residual": hidden.to(torch.bfloat16) * 0.5,
        "positions": torch.arange(rows, dtype=torch.int64) + chunk * 4,
        "key": [stage, request, chunk],
    }


def _same(received: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    if set(received) != set(expected) or received["key"] != expected["key"]:
        return False
    return all(torch.equal(received[k], expected[k]) and received[k].dtype == expected[k].dtype
               for k in ("hidden_states", "residual", "positions"))


@dataclass
class WalkReport:
    rank: int
    num_actions: int
    num_sent: int = 0
    num_received: int = 0
    num_computed: int = 0
    elapsed_s: float = 0.0
    mismatches: list[str] = field(default_factory=list)


def walk_rank(comm: PipelineCommunicator, actions: Sequence[Any], *, semantics: str = "async",
              group_map: Mapping[str, str] | None = None, timeout_s: float | None = None) -> WalkReport:
    """Run ``actions`` (schedule-core ``Action`` values of this rank) on ``comm``.

    Raises the first ``CommError`` (e.g. ``CommTimeoutError`` when the pattern deadlocks)."""
    from sglang_vpp.schedule import ActionKind

    if semantics not in ("async", "blocking"):
        raise ValueError(f"semantics must be 'async' or 'blocking', got {semantics!r}")
    report = WalkReport(rank=comm.rank, num_actions=len(actions))
    available: dict[tuple[int, int, int], dict[str, Any]] = {}
    pending: list[CommHandle] = []
    started = time.monotonic()
    for action in actions:
        key = (action.stage_index, action.request_index, action.chunk_index)
        group = (group_map or {}).get(action.group, action.group) if action.group else None
        if action.kind is ActionKind.COMPUTE:
            if action.stage_index > 0:
                previous = (action.stage_index - 1, action.request_index, action.chunk_index)
                if previous not in available:
                    report.mismatches.append(f"{action}: input {previous} neither computed here nor received")
            available[key] = stage_output(*key)
            report.num_computed += 1
        elif action.kind is ActionKind.SEND:
            if key not in available:
                report.mismatches.append(f"{action}: sends {key}, which this rank does not have")
                available[key] = stage_output(*key)
            handle = comm.isend(available[key], action.peer, group, action=str(action))
            report.num_sent += 1
            if semantics == "blocking":
                handle.wait(timeout_s)
            else:
                pending.append(handle)
                if len(pending) >= 64:  # reap finished sends; surface a failed one early
                    # One look per handle: one that finishes between two looks must not be dropped unwaited.
                    done = [h.is_ready() for h in pending]
                    for handle, ready in zip(pending, done):
                        if ready:
                            handle.wait(0)
                    pending = [h for h, ready in zip(pending, done) if not ready]
        elif action.kind is ActionKind.RECV:
            received = comm.irecv(action.peer, group, action=str(action)).wait(timeout_s)
            assert received is not None
            if not _same(received, stage_output(*key)):
                report.mismatches.append(f"{action}: received {received.get('key')} with other contents")
            available[key] = received
            report.num_received += 1
    for handle in pending:
        handle.wait(timeout_s)
    report.elapsed_s = time.monotonic() - started
    return report
