"""Plots of bench-serve: per-mode distributions of served request times (one panel per metric,
one box per mode) and a per-rank Gantt of each mode's replayed prefill.

Each request's own value is drawn as a dot over its mode's box (few requests per run here, so
the dots are the data; the box is the min / quartiles / max).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["rank_gantt_figure", "write_distribution_plot", "write_rank_gantt"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, title: str | None) -> None:
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)


def write_distribution_plot(metrics: Mapping[str, Mapping[str, Sequence[float]]], path: Path,
                            title: str | None = None) -> None:
    """``metrics``: metric label -> mode -> values (seconds). Writes a PNG to ``path``."""
    plt = _pyplot()
    panels = [(label, per_mode) for label, per_mode in metrics.items() if any(per_mode.values())]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.6), squeeze=False)
    for ax, (label, per_mode) in zip(axes[0], panels):
        modes = [mode for mode, values in per_mode.items() if values]
        data = [list(per_mode[mode]) for mode in modes]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(modes) + 1), modes)
        for i, values in enumerate(data, start=1):
            ax.plot([i] * len(values), values, "o", color="black", markersize=3, alpha=0.6)
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("seconds")
        ax.grid(axis="y", alpha=0.3)
    _save(fig, path, title)


def write_rank_gantt(spans_per_mode: Mapping[str, Mapping[int, Sequence[tuple[float, float, int, int]]]],
                     path: Path, title: str | None = None) -> None:
    """One panel per mode, one row per rank: the replayed prefill computes of one repeat
    (``record_replay.WindowReplay.spans``), coloured by micro-batch and labelled with the stage."""
    _save(rank_gantt_figure(spans_per_mode), path, title)


def rank_gantt_figure(spans_per_mode: Mapping[str, Mapping[int, Sequence[tuple[float, float, int, int]]]]):
    """The figure of ``write_rank_gantt``. The panels share one time axis (same scale, so modes
    compare by length) and one colour legend: the n-th micro-batch of each mode has the n-th
    colour."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    modes = [mode for mode, spans in spans_per_mode.items() if spans]
    fig, axes = plt.subplots(len(modes) or 1, 1, figsize=(10, 1.6 + 0.9 * sum(len(spans_per_mode[m]) for m in modes)),
                             squeeze=False, sharex=True)
    colours = plt.get_cmap("tab20").colors
    end = max((e for m in modes for items in spans_per_mode[m].values() for _, e, *_ in items), default=1.0) or 1.0
    most = 0
    for ax, mode in zip(axes[:, 0], modes):
        spans = spans_per_mode[mode]
        seqs = sorted({seq for items in spans.values() for *_, seq in items})
        most = max(most, len(seqs))
        colour_of = {seq: colours[i % len(colours)] for i, seq in enumerate(seqs)}
        for rank, items in spans.items():
            for start, stop, stage, seq in items:
                ax.broken_barh([(start, stop - start)], (rank - 0.4, 0.8), facecolors=colour_of[seq],
                               edgecolors="black", linewidth=0.3)
                if stop - start > end * 0.015:
                    ax.text((start + stop) / 2, rank, str(stage), ha="center", va="center", fontsize=6)
        ax.set_yticks(sorted(spans), [f"rank {r}" for r in sorted(spans)])
        ax.invert_yaxis()
        ax.set_title(f"{mode}: replayed prefill per rank (label: stage)", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    bottom = axes[-1, 0]
    bottom.set_xlim(0, end * 1.01)
    bottom.set_xlabel("seconds (replayed from per-stage CPU time; one scale for every mode)")
    shown = min(most, len(colours))
    handles = [Patch(facecolor=colours[i], edgecolor="black", linewidth=0.3, label=f"mb {i + 1}") for i in range(shown)]
    if handles:
        repeat = f"\n(repeat after {len(colours)})" if most > len(colours) else ""
        axes[0, 0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=6,
                          ncol=1 + (shown - 1) // 12, title=f"colour: n-th\nmicro-batch{repeat}", title_fontsize=7)
    return fig
