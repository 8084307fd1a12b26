"""Run a matrix of (workload, chunk size, mode) simulations and tabulate them.

Data flow: model + hardware presets -> ``AnalyticCostModel`` (or a given cost model) -> for each
chunk size and mode ``runner.run_mode`` -> ``ModeResult`` rows -> ``format_table`` / JSON.
Used by ``sglang-vpp simulate`` and ``benchmarks/sim_sweep.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..schedule.auto_size import AUTO, AUTO_CAP, is_auto
from ..schedule import BALANCE_MODES, Fold, RequestSpec, StageCostModel, balance_split, parse_fold, parse_policies
from .errors import SimError
from .config import SimConfig
from .idle import IDLE_CAUSES
from .runner import ModeResult, RunConfig, run_mode
from .workloads import Workload

__all__ = ["SweepProgress", "SweepRow", "simulate_matrix", "format_table", "format_idle_table", "format_splits", "best_by_mode",
           "size_label", "chunk_label"]


class SweepProgress:
    """Callbacks for a progress display of ``simulate_matrix``'s runs; no-ops here (nothing in the
    simulator prints)."""

    def run_started(self, mode: str, size: str, num_requests: int) -> None: ...

    def request_done(self, done: int) -> None: ...

    def run_finished(self, mode: str, size: str) -> None: ...


@dataclass
class SweepRow:
    workload: str
    seq_len: int | None
    """The prompt length for single-length workloads (long, short), else None."""
    result: ModeResult

    @property
    def bound_key(self) -> str:
        """What the rows compared in one ``run_lower_bound_s`` entry share: the prompt length
        (``"131072"``), or the workload's name (``"mixed"``, ``"file"``) where it has no one length."""
        return self.workload if self.seq_len is None else str(self.seq_len)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "seq_len": self.seq_len, **self.result.row()}


def simulate_matrix(workload: Workload, cost: StageCostModel, num_layers: int, modes: str | Sequence[str],
                    chunk_sizes: Sequence[int | str], num_ranks: int, split: Sequence[int] | None = None,
                    sim: SimConfig | None = None, seq_len: int | None = None,
                    keep_schedules: bool = False, balance: str = "even",
                    batch_requests: bool = True, jitter: float = 0.0, jitter_seed: int = 0,
                    fold: Fold | str = Fold.SPLIT, jitter_by: str = "stage",
                    partial_fill: bool | None = None, progress: SweepProgress | None = None) -> list[SweepRow]:
    """Every mode at every chunk size on one workload (the planner's estimate is ``cost``).

    ``balance="auto"``: each (mode, chunk size) runs on the layer split ``balance_split``
    chooses for this cost model from the workload's first requests (up to 8).
    ``batch_requests``, ``partial_fill``, ``jitter``, ``jitter_seed``, ``jitter_by``, ``fold``: see ``RunConfig``.
    A chunk size ``"auto"``
    runs the controller's ``auto`` chunker (``RunConfig.auto_chunk``) with every candidate allowed.
    ``progress`` hears of each run (mode, its size as ``size_label`` writes it, or auto) and of each
    request it completes.
    """
    progress = progress or SweepProgress()
    if balance not in BALANCE_MODES:
        raise SimError(f"--balance must be one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    if balance == "auto" and split:
        raise SimError("--balance auto chooses the layer split itself; drop --split or use --balance even")
    specs = parse_policies(modes if isinstance(modes, str) else ",".join(modes))
    fold = parse_fold(fold)
    probe = [RequestSpec(r.length) for r in workload.requests[:8]]
    rows = []
    for entry in chunk_sizes:
        auto = is_auto(entry)
        chunk_size = AUTO_CAP if auto else int(entry)
        for spec in specs:
            # Built first: it refuses bad knobs before a --balance auto search spends time on them.
            config = RunConfig(num_ranks, chunk_size, tuple(split) if split else None, batch_requests=batch_requests,
                               jitter=jitter, jitter_seed=jitter_seed, jitter_by=jitter_by, sim=sim or SimConfig(),
                               auto_chunk=auto, fold=fold, partial_fill=partial_fill)
            label = AUTO if auto else size_label(chunk_size)
            progress.run_started(str(spec.name), label, len(workload.requests))  # the split search is the run's
            if balance == "auto":
                config = replace(config, split=balance_split(
                    spec, num_ranks, num_layers, probe, chunk_size, cost, fold=fold, batching=batch_requests,
                    partial_fill=partial_fill))
            rows.append(SweepRow(workload.name, seq_len,
                                 run_mode(str(spec.name), workload, cost, config, num_layers, keep_schedules,
                                          on_request=progress.request_done)))
            progress.run_finished(str(spec.name), label)
    return rows


def best_by_mode(rows: Sequence[SweepRow]) -> dict[tuple[int | None, str], SweepRow]:
    """Per (seq_len, mode): the row with the smallest makespan (the mode's best chunk size)."""
    best: dict[tuple[int | None, str], SweepRow] = {}
    for row in rows:
        key = (row.seq_len, row.result.mode)
        if row.result.sim.ok and (key not in best or row.result.sim.makespan_s < best[key].result.sim.makespan_s):
            best[key] = row
    return best


def size_label(tokens: int | None) -> str:
    if tokens is None:
        return "-"
    for unit, scale in (("m", 1 << 20), ("k", 1 << 10)):
        if tokens >= scale and tokens % scale == 0:
            return f"{tokens // scale}{unit}"
    return str(tokens)


#: Printed tables fit this many columns: wide ones are split into several with the same key columns.
WIDTH = 80


def chunk_label(result: ModeResult) -> str:
    """The chunk size of a row: its size, or ``auto`` when the controller chose per situation."""
    return AUTO if result.auto_sizes else size_label(result.chunk_size)


def _key(row: SweepRow, mark: str = " ") -> str:
    return f"{size_label(row.seq_len):>6} {chunk_label(row.result):>6}{mark} {row.result.mode:<10}"


_KEY_HEADER = f"{'seq':>6} {'chunk':>6}  {'mode':<10}"


def _split_tables(keys: list[str], columns: list[tuple[str, list[str]]]) -> list[str]:
    """``keys`` (one per row) then as many of ``columns`` ((header, cells), each right-aligned to its
    widest entry) as fit in ``WIDTH``; the remaining columns go to further tables with the same keys."""
    tables: list[list[tuple[str, list[str]]]] = [[]]
    used = len(_KEY_HEADER)
    for header, cells in columns:
        width = 2 + max(len(header), *(len(c) for c in cells))
        if tables[-1] and used + width > WIDTH:
            tables.append([])
            used = len(_KEY_HEADER)
        tables[-1].append((header, cells))
        used += width
    out = []
    for table in tables:
        widths = [max(len(h), *(len(c) for c in cells)) for h, cells in table]
        head = _KEY_HEADER + "".join(f"  {h:>{w}}" for (h, _), w in zip(table, widths))
        body = [key + "".join(f"  {cells[i]:>{w}}" for (_, cells), w in zip(table, widths)) for i, key in enumerate(keys)]
        out.append("\n".join([head, "-" * len(head), *body]))
    return out


#: What ``*`` marks: ``best_by_mode``'s metric, which the TTFT column next to it is not.
BEST_LEGEND = "*: each mode's best chunk size per length: its smallest makespan (highest tok/s)"


def _rate(tok_s: float) -> str:
    """Whole tokens per second; three significant digits below 10, where whole ones read 0 for a
    run that did finish (a slow hardware preset)."""
    return f"{tok_s:.0f}" if tok_s >= 10 else f"{tok_s:.3g}"


def format_table(rows: Sequence[SweepRow], mark_best: bool = False) -> str:
    """One line per (seq_len, chunk size, mode), split into tables that fit 80 columns; ``*`` marks
    each mode's best chunk size (``BEST_LEGEND`` under the tables says by what); a deadlocked run
    is listed after the tables."""
    best = {id(r) for r in best_by_mode(rows).values()} if mark_best else set()
    done = [row for row in rows if row.result.sim.ok]
    sims = [(row.result, row.result.sim) for row in done]
    columns = [
        ("TTFT s", [f"{s.ttft_s:.3f}" for _, s in sims]), ("tok/s", [_rate(s.throughput_tok_s) for _, s in sims]),
        ("compute s", [f"{s.compute_s:.3f}" for _, s in sims]), ("bubble s", [f"{s.bubble_s:.3f}" for _, s in sims]),
        ("exp.comm s", [f"{s.exposed_comm_s:.3f}" for _, s in sims]),
        ("bubble%", [f"{100 * s.bubble_ratio:.2f}%" for _, s in sims]), ("steps", [str(s.steps) for _, s in sims]),
        ("chunks", [str(s.num_chunks) for _, s in sims]), ("makespan s", [f"{s.makespan_s:.3f}" for _, s in sims]),
        ("bound s", [f"{r.lower_bound_s:.3f}" for r, _ in sims]),
        ("gap%", [f"{100 * r.gap_to_bound:.1f}%" for r, _ in sims]),
    ]  # fmt: skip
    keys = [_key(row, "*" if id(row) in best else " ") for row in done]
    parts = _split_tables(keys, columns) if done else []
    if best:
        parts.append(BEST_LEGEND)
    for row in rows:
        if not row.result.sim.ok:
            blocked = "; ".join(f"rank {b['rank']} at {b['action']}" for b in row.result.sim.deadlock.blocked[:2])
            parts.append(f"{_key(row)} DEADLOCK:\n  {blocked}")
    return "\n\n".join(parts)


def format_idle_table(rows: Sequence[SweepRow]) -> str:
    """Bubble per rank (mean) split by cause, one line per row of ``format_table``.

    A cause column is left out when it is zero in every row (e.g. ``rendezvous`` without a
    blocking mode); ``other`` is shown only if the causes miss part of the bubble.
    """
    done = [row for row in rows if row.result.sim.ok]
    shown = [c for c in IDLE_CAUSES if any(abs(r.result.sim.idle_by_cause.get(c, 0.0)) > 1e-9 for r in done)]
    columns = [("bubble s", [f"{row.result.sim.bubble_s:.3f}" for row in done])]
    columns += [(c, [f"{row.result.sim.idle_by_cause.get(c, 0.0):.3f}" for row in done]) for c in shown]
    tables = _split_tables([_key(row) for row in done], columns) if done else []
    return "\nidle by cause (s per rank, mean over ranks)\n" + "\n\n".join(tables)


def format_splits(rows: Sequence[SweepRow]) -> str:
    """The layer split each row ran on, one line per row of ``format_table`` (a deadlocked run's
    too): ``--balance auto`` chooses one per mode, chunk size and length, and the title can only
    say that it did."""
    cells = [",".join(map(str, row.result.split)) for row in rows]
    tables = _split_tables([_key(row) for row in rows], [("layers per stage", cells)]) if rows else []
    return "\nlayer split chosen by --balance auto\n" + "\n\n".join(tables)
