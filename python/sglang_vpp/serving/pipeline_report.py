"""Per-rank prefill compute/idle of a running server, from the plugin's ``--vpp-trace`` files.

Data flow::

    server started with --vpp-trace DIR (any --pp-mode; see sglang_plugin/accounting.py)
      -> each rank rewrites DIR/vpp_rank<r>.records.json whenever it goes idle
    wait_for_records(DIR, num_ranks, since)  every rank's file rewritten since ``since``
    last_seq(records)                        before a measured run: the mark to measure after
      -> prefill records with seq > the mark
      -> record_replay.replay_window(): the executed order on the simulator's engine, each
         compute timed by its per-stage CPU time (dedicated-hardware estimate)
      -> PipelineIdle (per rank: busy, idle, makespan; counts; the Gantt's spans)
    min_cost_idle(repeats)                   one replay of each compute's minimum CPU time over
                                             repeats of the same work (least disturbed estimate)
    equal_cost_idle({mode: repeats}, layouts) every mode's windows re-timed on ONE cost model
                                             shared by all modes: what compares modes

Only prefill computes count (the comparison is about chunked prefill); decode steps are left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import json_text
from ..trace_records import records_file
from .record_replay import RankTimeline, Span, replay_window, shared_cost_model

if TYPE_CHECKING:
    from ..runtime.equal_cost import SharedCostModel
    from ..schedule import Layout

__all__ = [
    "EQUAL_COST_METHOD",
    "PipelineIdle",
    "equal_cost_idle",
    "TraceUnavailableError",
    "measure_idle",
    "min_cost_idle",
    "last_seq",
    "read_records",
    "wait_for_records",
]


class TraceUnavailableError(RuntimeError):
    """The server's trace files did not appear or were not rewritten in time."""


def _load(path: Path) -> dict | None:
    try:
        return json_text.loads(path.read_text())
    except (OSError, json.JSONDecodeError):  # absent, or caught between write and rename
        return None


def read_records(trace_dir: str | Path, num_ranks: int) -> list[dict] | None:
    """All ranks' records, or None while some rank has not written its file yet."""
    out: list[dict] = []
    for rank in range(num_ranks):
        data = _load(records_file(Path(trace_dir), rank))
        if data is None:
            return None
        out.extend(data["records"])
    return out


def last_seq(records: list[dict]) -> int:
    """The highest micro-batch id among ``records`` (-1 for none): the mark before a measured run."""
    return max((r["seq"] for r in records), default=-1)


def wait_for_records(
    trace_dir: str | Path, num_ranks: int, since: float, timeout: float = 60.0, settle: float = 1.0
) -> list[dict]:
    """Every rank's records once each file was rewritten after ``since`` (``time.time()``) and no
    file changed for ``settle`` seconds.

    Call it after the measured requests returned: their computes are finished by then, and each
    rank rewrites its file when it goes idle right after, possibly before the client saw the last
    answer; ``since`` is therefore the start of the measured run, and the settle time waits out
    a rank's last rewrite.
    """
    trace_dir = Path(trace_dir)
    paths = [records_file(trace_dir, rank) for rank in range(num_ranks)]
    deadline = time.monotonic() + timeout
    last_change, last_mtimes = time.monotonic(), None
    while time.monotonic() < deadline:
        mtimes = [p.stat().st_mtime if p.exists() else None for p in paths]
        if mtimes != last_mtimes:
            last_change, last_mtimes = time.monotonic(), mtimes
        fresh = all(m is not None and m >= since for m in mtimes)
        if fresh and time.monotonic() - last_change >= settle:
            records = read_records(trace_dir, num_ranks)
            if records is not None:
                return records
        time.sleep(0.1)
    raise TraceUnavailableError(
        f"no fresh pipeline records in {trace_dir} after {timeout:.0f} s (expected "
        f"{', '.join(str(p) for p in paths)} rewritten when the server goes idle); was the server "
        "started with --vpp-trace on this directory?"
    )


@dataclass(frozen=True)
class PipelineIdle:
    """Replayed per-rank prefill accounting of one measured window."""

    num_ranks: int
    num_prefill_computes: int
    num_micro_batches: int
    ranks: list[RankTimeline]
    window: list[dict] = field(default_factory=list, repr=False, compare=False)
    """The prefill records replayed (for ``min_cost_idle``)."""
    spans: dict[int, list[Span]] = field(default_factory=dict, repr=False, compare=False)
    """Per rank: the replayed computes (``record_replay.WindowReplay.spans``)."""
    method: str = "replayed from per-stage thread CPU time (dedicated-hardware estimate, transfers cost 0)"

    def to_json(self) -> dict:
        return {
            "num_ranks": self.num_ranks,
            "num_prefill_computes": self.num_prefill_computes,
            "num_micro_batches": self.num_micro_batches,
            "ranks": [{**asdict(r), "idle_fraction": r.idle_fraction} for r in self.ranks],
            "method": self.method,
        }


def measure_idle(records: list[dict], num_ranks: int, after_seq: int = -1) -> PipelineIdle:
    """Prefill records of micro-batches after ``after_seq``, replayed (module docstring)."""
    window = [r for r in records if r["seq"] > after_seq and r["is_prefill"]]
    replay = replay_window(window, num_ranks)
    return PipelineIdle(
        num_ranks=num_ranks,
        num_prefill_computes=len(window),
        num_micro_batches=len({r["seq"] for r in window}),
        ranks=replay.ranks,
        window=window,
        spans=replay.spans,
    )


def _by_position(window: list[dict]) -> dict[tuple[int, int, int], dict]:
    """Records keyed by (micro-batch position in the window, rank, stage)."""
    position = {seq: i for i, seq in enumerate(sorted({r["seq"] for r in window}))}
    return {(position[r["seq"]], r["rank"], r["stage"]): r for r in window}


def min_cost_idle(runs: list[PipelineIdle]) -> PipelineIdle | None:
    """One replay of the per-compute minimum CPU time over repeats of the same work.

    Why: on shared cores, interference only ever adds time to a compute, so the minimum over
    repeats is the least disturbed estimate of each stage's cost (the reasoning behind
    ``timeit``'s minimum). Needs repeats with the same structure (same micro-batches, ranks and
    stages, e.g. one fixed-chunk prompt per repeat); returns None otherwise (dcpp's chunking or
    concurrent batching can differ between repeats). Executed order comes from the first repeat.
    """
    if len(runs) < 2 or not runs[0].window:
        return None
    keyed = [_by_position(run.window) for run in runs]
    if any(k.keys() != keyed[0].keys() for k in keyed[1:]):
        return None
    merged = []
    for key, first in keyed[0].items():
        record = dict(first)
        record["seq"] = key[0]
        record["cpu_s"] = min(k[key]["cpu_s"] for k in keyed)
        merged.append(record)
    replay = replay_window(merged, runs[0].num_ranks)
    return PipelineIdle(
        num_ranks=runs[0].num_ranks,
        num_prefill_computes=len(merged),
        num_micro_batches=runs[0].num_micro_batches,
        ranks=replay.ranks,
        window=merged,
        spans=replay.spans,
        method=f"replayed from the minimum thread CPU time of each stage compute over {len(runs)} repeats "
        "(dedicated-hardware estimate, transfers cost 0)",
    )


EQUAL_COST_METHOD = ("re-timed on one cost model shared by all modes (runtime/equal_cost.py), fitted on every "
                     "mode's per-stage thread CPU times of the other repeats (dedicated-hardware estimate, "
                     "transfers cost 0)")


def equal_cost_idle(idle: Mapping[str, Sequence[PipelineIdle]],
                    layouts: Mapping[str, Layout]) -> tuple[dict[str, list[PipelineIdle]], list[SharedCostModel]]:
    """Per mode and repeat ``j``: that repeat's window re-timed on one cost model shared by all
    modes, fitted on the *other* repeats (all repeats when there is one; a position the others
    never ran falls back to the model of all repeats), as ``sglang-vpp bench`` does; and the model
    of each repeat. Empty when some mode has no prefill records to fit."""
    repeats = min((len(runs) for runs in idle.values()), default=0)
    windows = {mode: [run.window for run in runs[:repeats]] for mode, runs in idle.items()}
    if not repeats or any(not window for mode_windows in windows.values() for window in mode_windows):
        return {}, []
    everything = shared_cost_model(windows, layouts)
    out: dict[str, list[PipelineIdle]] = {mode: [] for mode in idle}
    models = []
    for j in range(repeats):
        others = {mode: [w for i, w in enumerate(ws) if i != j] for mode, ws in windows.items()}
        model = shared_cost_model(others, layouts, fallback=everything) if repeats > 1 else everything
        models.append(model)
        for mode, runs in idle.items():
            window = windows[mode][j]
            replay = replay_window(window, runs[j].num_ranks, layouts[mode], model)
            out[mode].append(PipelineIdle(
                num_ranks=runs[j].num_ranks, num_prefill_computes=len(window),
                num_micro_batches=runs[j].num_micro_batches, ranks=replay.ranks,
                window=window, spans=replay.spans, method=EQUAL_COST_METHOD))  # fmt: skip
    return out, models
