"""Text and JSON forms of schedules, and the rank x step grid used in error messages.

Text form: one line per rank, ``rank <r>: <action> <action> ...`` (actions as in ``ir.py``).
JSON form: ``{"policy", "comm_semantics", "groups", "layout", "chunks", "requests", "ranks"}``
where ``ranks`` is a list of lists of action strings. Both round-trip.
"""

from __future__ import annotations

from typing import Sequence

from .errors import ParseError
from .ir import Action, ChunkSpec, RequestSpec
from .layout import Layout
from .policies import CommSemantics, Policy
from .schedule import Schedule

__all__ = ["schedule_to_text", "schedule_to_json", "schedule_from_json", "parse_rank_lines", "format_grid"]


def schedule_to_text(schedule) -> str:
    return "\n".join(
        f"rank {rank}: " + " ".join(str(a) for a in actions)
        for rank, actions in enumerate(schedule.rank_actions)
    )


def parse_rank_lines(lines: Sequence[str]) -> list[list[Action]]:
    """Parse ``rank r: a b c`` lines (or bare ``a b c`` lines, one per rank in order)."""
    ranks: list[list[Action]] = []
    for number, line in enumerate(lines):
        body = line.split(":", 1)[1] if line.strip().startswith("rank") else line
        if line.strip().startswith("rank"):
            declared = int(line.split(":", 1)[0].split()[1])
            if declared != number:
                raise ParseError(f"line {number + 1}: expected 'rank {number}:', got {line[:20]!r}")
        ranks.append([Action.parse(token) for token in body.split()])
    return ranks


def _chunk_to_json(chunk: ChunkSpec) -> dict:
    out = {"request": chunk.request_index, "chunk": chunk.chunk_index, "start": chunk.start,
           "tokens": chunk.num_tokens, "last": chunk.is_last}
    if chunk.batch:
        out["batch"] = [_chunk_to_json(part) for part in chunk.batch]
    return out


def _chunk_from_json(data: dict) -> ChunkSpec:
    return ChunkSpec(data["request"], data["chunk"], data["start"], data["tokens"], data.get("last", False),
                     tuple(_chunk_from_json(part) for part in data.get("batch", ())))


def schedule_to_json(schedule: Schedule) -> dict:
    return {
        "policy": str(schedule.policy),
        "comm_semantics": str(schedule.comm_semantics),
        "groups": list(schedule.groups),
        "layout": schedule.layout.to_dict(),
        "chunks": [_chunk_to_json(c) for c in schedule.chunks],
        "requests": [{"length": r.length, "arrival": r.arrival} for r in schedule.requests],
        "ranks": [[str(a) for a in actions] for actions in schedule.rank_actions],
    }


def schedule_from_json(data: dict) -> Schedule:
    try:
        return Schedule(
            policy=Policy(data["policy"]),
            layout=Layout.from_dict(data["layout"]),
            chunks=tuple(_chunk_from_json(c) for c in data["chunks"]),
            rank_actions=tuple(tuple(Action.parse(a) for a in actions) for actions in data["ranks"]),
            comm_semantics=CommSemantics(data["comm_semantics"]),
            groups=tuple(data["groups"]),
            requests=tuple(RequestSpec(r["length"], r.get("arrival", 0.0)) for r in data.get("requests", [])),
        )
    except (KeyError, TypeError) as error:
        raise ParseError(f"schedule JSON is missing or mistypes a field: {error!r}") from None


def format_grid(rank_actions: Sequence[Sequence[Action]], mark: tuple[int, int] | None = None,
                window: int = 6) -> str:
    """A step x rank table (PyTorch style); ``mark=(rank, step)`` gets ``<-- ERROR HERE``.

    Only ``window`` steps around the mark are shown for long schedules.
    """
    num_steps = max((len(a) for a in rank_actions), default=0)
    lo, hi = 0, num_steps
    if mark is not None and num_steps > 2 * window + 1:
        lo, hi = max(0, mark[1] - window), min(num_steps, mark[1] + window + 1)
    width = max([len(str(a)) for actions in rank_actions for a in actions[lo:hi]] + [8])
    header = "step  " + " ".join(f"{'rank ' + str(r):<{width}}" for r in range(len(rank_actions)))
    rows = [header]
    for step in range(lo, hi):
        cells = []
        for actions in rank_actions:
            cells.append(f"{str(actions[step]) if step < len(actions) else '':<{width}}")
        row = f"{step:<5} " + " ".join(cells)
        if mark is not None and step == mark[1]:
            row += f"   <-- ERROR HERE (rank {mark[0]})"
        rows.append(row.rstrip() if mark is None or step != mark[1] else row)
    return "\n".join(rows)
