"""Run a matrix of (workload, chunk size, mode) simulations and tabulate them.

Data flow: model + hardware presets -> ``AnalyticCostModel`` (or a given cost model) -> for each
chunk size and mode ``runner.run_mode`` -> ``ModeResult`` rows -> ``format_table`` / JSON.
Used by ``sglang-vpp simulate`` and ``benchmarks/sim_sweep.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..schedule import BALANCE_MODES, RequestSpec, StageCostModel, balance_split, parse_policies
from .errors import SimError
from .config import SimConfig
from .idle import IDLE_CAUSES
from .runner import ModeResult, RunConfig, run_mode
from .workloads import Workload

__all__ = ["SweepRow", "simulate_matrix", "format_table", "format_idle_table", "best_by_mode", "size_label"]


@dataclass
class SweepRow:
    workload: str
    seq_len: int | None
    """The prompt length for single-length workloads (long, short), else None."""
    result: ModeResult

    def to_dict(self) -> dict:
        return {"workload": self.workload, "seq_len": self.seq_len, **self.result.row()}


def simulate_matrix(workload: Workload, cost: StageCostModel, num_layers: int, modes: str | Sequence[str],
                    chunk_sizes: Sequence[int], num_ranks: int, split: Sequence[int] | None = None,
                    sim: SimConfig | None = None, seq_len: int | None = None,
                    keep_schedules: bool = False, balance: str = "even",
                    batch_requests: bool = True) -> list[SweepRow]:
    """Every mode at every chunk size on one workload (the planner's estimate is ``cost``).

    ``balance="auto"``: each (mode, chunk size) runs on the layer split ``balance_split``
    chooses for this cost model from the workload's first requests (up to 8).
    ``batch_requests``: see ``RunConfig.batch_requests``.
    """
    if balance not in BALANCE_MODES:
        raise SimError(f"--balance must be one of {', '.join(BALANCE_MODES)}, got {balance!r}")
    if balance == "auto" and split:
        raise SimError("--balance auto chooses the layer split itself; drop --split or use --balance even")
    specs = parse_policies(modes if isinstance(modes, str) else ",".join(modes))
    probe = [RequestSpec(r.length) for r in workload.requests[:8]]
    rows = []
    for chunk_size in chunk_sizes:
        for spec in specs:
            chosen = tuple(split) if split else None
            if balance == "auto":
                chosen = balance_split(spec, num_ranks, num_layers, probe, chunk_size, cost)
            config = RunConfig(num_ranks, chunk_size, chosen, batch_requests=batch_requests, sim=sim or SimConfig())
            rows.append(SweepRow(workload.name, seq_len,
                                 run_mode(str(spec.name), workload, cost, config, num_layers, keep_schedules)))
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


def format_table(rows: Sequence[SweepRow], mark_best: bool = False) -> str:
    """One line per (seq_len, chunk size, mode); ``*`` marks each mode's best chunk size."""
    best = {id(r) for r in best_by_mode(rows).values()} if mark_best else set()
    header = (f"{'seq':>6} {'chunk':>6}  {'mode':<10} {'TTFT s':>9} {'tok/s':>9} {'compute s':>10} {'bubble s':>9} "
              f"{'exp.comm s':>10} {'bubble%':>8} {'steps':>6} {'chunks':>6} {'bound s':>9} {'gap%':>6}")
    lines = [header, "-" * len(header)]
    for row in rows:
        r, s = row.result, row.result.sim
        if not s.ok:
            lines.append(f"{size_label(row.seq_len):>6} {size_label(r.chunk_size):>6}  {r.mode:<10} DEADLOCK: "
                         + "; ".join(f"rank {b['rank']} at {b['action']}" for b in s.deadlock.blocked[:2]))
            continue
        mark = "*" if id(row) in best else " "
        lines.append(
            f"{size_label(row.seq_len):>6} {size_label(r.chunk_size):>6}{mark} {r.mode:<10} {s.ttft_s:9.3f} {s.throughput_tok_s:9.0f} "
            f"{s.compute_s:10.3f} {s.bubble_s:9.3f} {s.exposed_comm_s:10.3f} {100 * s.bubble_ratio:7.2f}% "
            f"{s.steps:6d} {s.num_chunks:6d} {r.lower_bound_s:9.3f} {100 * r.gap_to_bound:5.1f}%")
    return "\n".join(lines)


def format_idle_table(rows: Sequence[SweepRow]) -> str:
    """Bubble per rank (mean) split by cause, one line per row of ``format_table``.

    A cause column is left out when it is zero in every row (e.g. ``rendezvous`` without a
    blocking mode); ``other`` is shown only if the causes miss part of the bubble.
    """
    done = [row for row in rows if row.result.sim.ok]
    shown = [c for c in IDLE_CAUSES if any(abs(r.result.sim.idle_by_cause.get(c, 0.0)) > 1e-9 for r in done)]
    header = f"{'seq':>6} {'chunk':>6}  {'mode':<10} {'bubble s':>9} " + " ".join(f"{c:>14}" for c in shown)
    lines = ["idle by cause (s per rank, mean over ranks)", header, "-" * len(header)]
    for row in done:
        r, s = row.result, row.result.sim
        idle = s.idle_by_cause
        lines.append(f"{size_label(row.seq_len):>6} {size_label(r.chunk_size):>6}  {r.mode:<10} {s.bubble_s:9.3f} "
                     + " ".join(f"{idle.get(c, 0.0):14.3f}" for c in shown))
    return "\n".join(lines)
