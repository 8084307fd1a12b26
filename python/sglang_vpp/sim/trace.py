"""Timeline output: Chrome/Perfetto trace-event JSON and a Gantt PNG like the paper's Figure 2.

Input: one timeline (a ``SimResult`` or a list of ``TimelineSlice``) or several labelled ones
(``{"cpp": result_a, "vpp-pack": result_b}``) to compare side by side.

Trace layout (open in ui.perfetto.dev): pid = rank (plus ``100 * i`` for the i-th labelled run,
whose processes are named ``"<label> rank <r>"``), tid = stream: ``compute`` (stage computes and the
waits that hold the rank) and one track per comm group (``pp``, ``fwd``, ``bwd``) holding the
transfers. One complete ("X") event per slice; times in microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence, Union

from .entities import SliceKind, TimelineSlice
from .result import SimResult

__all__ = ["write_perfetto_trace", "write_gantt_png", "perfetto_events"]

Timeline = Union[SimResult, Sequence[TimelineSlice]]
_TIDS = {"compute": 0, "pp": 1, "fwd": 2, "bwd": 3}
_PID_STRIDE = 100


def _labelled(timelines: Timeline | Mapping[str, Timeline]) -> list[tuple[str, list[TimelineSlice]]]:
    if isinstance(timelines, Mapping):
        items = list(timelines.items())
    else:
        items = [("", timelines)]
    out = []
    for label, timeline in items:
        slices = timeline.timeline if isinstance(timeline, SimResult) else list(timeline)
        out.append((str(label), slices))
    return out


def perfetto_events(timelines: Timeline | Mapping[str, Timeline]) -> list[dict]:
    """Trace events (metadata + one "X" event per slice)."""
    events: list[dict] = []
    for index, (label, slices) in enumerate(_labelled(timelines)):
        ranks = sorted({s.rank for s in slices})
        for rank in ranks:
            pid = index * _PID_STRIDE + rank
            name = f"{label} rank {rank}".strip()
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            for stream, tid in _TIDS.items():
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
        for s in slices:
            tid = _TIDS["compute"] if s.kind in (SliceKind.COMPUTE, SliceKind.WAIT_COMM, SliceKind.WAIT_DATA) \
                else _TIDS.get(s.group or "pp", 1)
            name = s.action if s.kind is not SliceKind.WAIT_COMM else f"exposed comm {s.action}"
            if s.kind is SliceKind.WAIT_DATA:
                name = f"wait data {s.action}"
            args = {"stage": s.stage_index, "request": s.request_index, "chunk": s.chunk_index, **s.args}
            events.append({"ph": "X", "name": name, "cat": str(s.kind), "pid": index * _PID_STRIDE + s.rank,
                           "tid": tid, "ts": s.start * 1e6, "dur": max(0.0, s.end - s.start) * 1e6, "args": args})
    return events


def write_perfetto_trace(timelines: Timeline | Mapping[str, Timeline], path: str | Path) -> None:
    """Write trace-event JSON (``{"traceEvents": [...]}``) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": perfetto_events(timelines), "displayTimeUnit": "ms"}))


# Transfers: colours outside the tab20 palette the computes use, so a send never reads as a chunk.
_SEND_FWD_COLOR = "black"
_SEND_BWD_COLOR = "darkviolet"


def write_gantt_png(timelines: Timeline | Mapping[str, Timeline], path: str | Path,
                    title: str | None = None, dpi: int = 130) -> None:
    """One panel per labelled timeline, one row per rank: stage computes coloured by chunk and
    labelled ``s<stage>/C<chunk>`` (``R<request>`` prefix when several requests), exposed comm
    hatched, transfers as thin bars under each row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = _labelled(timelines)
    end = max((s.end for _, slices in panels for s in slices), default=1.0) or 1.0
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 1.0 + 1.3 * sum(
        max(1, len({s.rank for s in slices})) for _, slices in panels) / max(1, len(panels)) * len(panels) / 1.6),
        squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab20")
    for ax, (label, slices) in zip(axes[:, 0], panels):
        ranks = sorted({s.rank for s in slices}) or [0]
        multi = len({s.request_index for s in slices if s.request_index >= 0}) > 1
        for s in slices:
            row = ranks.index(s.rank)
            y = len(ranks) - 1 - row
            if s.kind is SliceKind.COMPUTE:
                color = cmap((s.chunk_index * 2 + (s.request_index % 2)) % 20)
                ax.barh(y, s.duration, left=s.start, height=0.62, color=color, edgecolor="black", linewidth=0.4)
                text = f"{'R%d ' % s.request_index if multi else ''}s{s.stage_index}/C{s.chunk_index}"
                if s.duration > end * 0.025:
                    ax.text(s.start + s.duration / 2, y, text, ha="center", va="center", fontsize=6)
            elif s.kind is SliceKind.WAIT_COMM:
                ax.barh(y, s.duration, left=s.start, height=0.62, color="white", edgecolor="red",
                        hatch="////", linewidth=0.4)
            elif s.kind is SliceKind.SEND:
                offset = -0.38 if s.group != "bwd" else -0.44
                ax.barh(y + offset, s.duration, left=s.start, height=0.05,
                        color=_SEND_FWD_COLOR if s.group != "bwd" else _SEND_BWD_COLOR)
        ax.set_yticks(range(len(ranks)))
        ax.set_yticklabels([f"pp{r}" for r in reversed(ranks)])
        ax.set_ylim(-0.6, len(ranks) - 0.4)
        ax.set_title(label or "", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time (s)")
    axes[-1, 0].set_xlim(0, end * 1.01)
    handles = [Patch(facecolor="white", edgecolor="red", hatch="////", label="exposed comm"),
               Patch(color=_SEND_FWD_COLOR, label="send fwd/pp"), Patch(color=_SEND_BWD_COLOR, label="send bwd")]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=3)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
