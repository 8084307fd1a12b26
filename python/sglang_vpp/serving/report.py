"""bench-serve's tables: served times per server and the replayed pipeline per mode.

Two narrow tables instead of one wide one, so ``--format table`` stays readable at 80 columns;
``md`` prints the same rows as Markdown. Every title names the servers (modes) it covers.
Input: the ``runs`` list of the JSON output (``summary`` from ``bench_serving.merge_passes``,
``pipeline`` from the launched runs).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["host_verdict_lines", "render_tables", "wrap"]

SERVED_NOTE = ("times: SGLang's bench_serving, wall clock on this host (servers run one after another; "
               "not a pipeline speedup measurement)")
PIPELINE_NOTE = ("equal-cost: each mode's executed prefill re-timed as if every rank had its own device "
                 "(transfers cost 0) on ONE cost model fitted on the per-stage thread CPU times of every mode "
                 "(repeat j: fitted on the other repeats), so only the schedules differ; the pipeline verdict "
                 "compares these. idle: median over repeats. Own-cost replays (each mode's own CPU times, "
                 "which include its cache effects) are in --json only")


def _ms(stats: dict[str, float] | None, key: str) -> str:
    return "-" if not stats else f"{stats[key]:.1f}"


def _served_rows(runs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["server", "ok", "TTFT med", "TTFT p99", "ITL med", "ITL p99", "E2E med", "out tok/s"]
    rows = []
    for run in runs:
        s = run["summary"]
        throughput = s.get("output_throughput")
        rows.append([
            str(run["label"] or run["url"]), f"{s['num_requests'] - s['num_failed']}/{s['num_requests']}",
            _ms(s["ttft_ms"], "median"), _ms(s["ttft_ms"], "p99"), _ms(s["itl_ms"], "median"),
            _ms(s["itl_ms"], "p99"), _ms(s["e2e_ms"], "median"), "-" if throughput is None else f"{throughput:.1f}",
        ])  # fmt: skip
    return header, rows


def _pipeline_rows(runs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["mode", "equal-cost makespan s", "idle per rank (equal-cost)"]
    rows = []
    for run in runs:
        shared = (run.get("pipeline") or {}).get("equal_cost") or {}
        values = shared.get("makespan_s") or []
        makespan = "-" if not values else f"{statistics.median(values):.3f}" + (
            f" [{min(values):.3f}-{max(values):.3f}]" if len(values) > 1 else "")
        idle = " ".join(f"r{rank} {spread['median']:.0%}" for rank, spread in enumerate(shared.get("idle_fraction") or []))
        rows.append([str(run["label"]), makespan, idle or "-"])
    return header, rows


HOST_NOTE = ("host: the scheduler thread's CPU time between a rank's forwards (scheduling, batch "
             "building, messages, TP agreement, results), summed over a micro-batch's forwards on the rank "
             "(fwd/mb: stock 1, fold-back 2), median over micro-batches; median [min-max] over repeats; "
             "mb/pass: micro-batches per pass (median), how often a pass pays it")


def _range(spread: dict[str, float]) -> str:
    return f"{spread['median']:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"


def _host_rows(runs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    num_ranks = max(len((run.get("host_time") or {}).get("per_micro_batch_ms") or []) for run in runs)
    header = ["mode", *(f"r{k} ms/micro-batch" for k in range(num_ranks)), "mb/pass", "fwd/mb"]
    rows = []
    for run in runs:
        host = run.get("host_time")
        if not host:
            rows.append([str(run["label"]), *(["-"] * num_ranks), "-", "-"])
            continue
        ratio = "/".join(f"{s['median']:.1f}" for s in host["forwards_per_micro_batch"])
        count = host.get("micro_batches")
        rows.append([str(run["label"]), *(_range(s) for s in host["per_micro_batch_ms"]),
                     "-" if not count else f"{count['median']:.0f}", ratio])
    return header, rows


def host_verdict_lines(runs: Sequence[dict[str, Any]], baseline: str = "cpp") -> list[str]:
    """Per mode against ``baseline``: the largest per-rank excess of its median host time per
    micro-batch, and whether it is below, within or over ``host_time.WITHIN`` of the baseline's.

    Servers run one after another, so a difference is the unpaired kind (``verdict``): ``below``
    or ``over`` stands only where the min-max ranges over repeats do not overlap on the ranks it
    rests on (``over``: the rank named; ``below``: every rank), else the line says no significant
    difference and names the rank whose ranges overlap."""
    from sglang_vpp.verdict import percent, ranges_overlap

    from .host_time import WITHIN

    base = next((run.get("host_time") for run in runs if run["label"] == baseline), None)
    if not base:
        return []
    out = [f"verdict (host time per micro-batch vs {baseline}, within {WITHIN:.0%} counts as equal):"]
    for run in runs:
        host = run.get("host_time")
        if run["label"] == baseline or not host:
            continue
        pairs = list(zip(host["per_micro_batch_ms"], base["per_micro_batch_ms"]))
        excess = {k: mine["median"] / theirs["median"] - 1.0 for k, (mine, theirs) in enumerate(pairs)
                  if theirs["median"] > 0}
        if not excess:
            continue
        worst = max(excess, key=lambda k: excess[k])
        overlapping = [k for k, (mine, theirs) in enumerate(pairs)
                       if ranges_overlap(mine["min"], mine["max"], theirs["min"], theirs["max"])]
        word = (f"below {baseline}" if excess[worst] < -WITHIN
                else f"within {WITHIN:.0%}" if excess[worst] <= WITHIN else f"over {WITHIN:.0%}")
        rests_on = list(excess) if excess[worst] < -WITHIN else [worst]
        blurred = [k for k in rests_on if k in overlapping]
        repeats = min(host.get("repeats", 1), base.get("repeats", 1))
        if abs(excess[worst]) > WITHIN and repeats < 2:
            word = "no significant difference (one repeat gives no range)"
        elif blurred and not word.startswith("within"):
            word = f"no significant difference (min-max ranges overlap on rank {blurred[0]})"
        ranges = "; ranges overlap on every rank" if word.startswith("within") and len(overlapping) == len(pairs) else ""
        out.append(wrap(f"{run['label']}: {percent(excess[worst], WITHIN, 0)} on rank {worst} -> {word}{ranges}"))
    return out if len(out) > 1 else []  # fmt: skip


def _text_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 or i == len(cells) - 1 and not c[:1].isdigit() else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    # A title naming six modes is longer than 80 columns: it wraps, the table does not.
    return "\n".join([wrap(title), line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def _md_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    out = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


def wrap(text: str, width: int = 80) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _failure_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per server with failed requests: how many, and the first reason."""
    out = []
    for run in runs:
        summary = run["summary"]
        if summary["num_failed"]:
            reason = (summary.get("errors") or ["?"])[0]
            out.append(wrap(f"FAILED ({run['label'] or run['url']}): {summary['num_failed']} of "
                            f"{summary['num_requests']} requests not served (left out of every time): {reason}"))
    return out


def render_tables(runs: Sequence[dict[str, Any]], fmt: str = "table", notes: Sequence[str] = ()) -> str:
    """The served-times table (with its failed requests), and the pipeline table when any run has
    pipeline records; ``notes`` about the whole comparison (e.g. servers sharing this host) follow."""
    names = ", ".join(str(run["label"] or run["url"]) for run in runs)
    table = _md_table if fmt == "md" else _text_table
    parts = [table(f"bench-serve [{names}]: served times, ms (tok/s)", *_served_rows(runs)),
             *_failure_lines(runs), *(wrap(f"note: {note}") for note in notes), wrap(SERVED_NOTE)]
    if any(run.get("pipeline") for run in runs):
        parts += [table(f"bench-serve [{names}]: prefill pipeline per rank", *_pipeline_rows(runs)),
                  wrap(PIPELINE_NOTE)]
    if any(run.get("host_time") for run in runs):
        verdict = host_verdict_lines(runs)
        parts += [table(f"bench-serve [{names}]: host time per micro-batch, ms", *_host_rows(runs)),
                  wrap(HOST_NOTE), *(["\n".join(verdict)] if verdict else [])]
    for run in runs:
        for note in run.get("notes") or []:
            parts.append(wrap(f"note ({run['label']}): {note}"))
    return "\n\n".join(parts)
