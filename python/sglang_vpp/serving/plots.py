"""Per-mode distributions of served request times: one panel per metric, one box per mode.

Each request's own value is drawn as a dot over its mode's box (few requests per run here, so
the dots are the data; the box is the min / quartiles / max).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["write_distribution_plot"]


def write_distribution_plot(metrics: Mapping[str, Mapping[str, Sequence[float]]], path: Path,
                            title: str | None = None) -> None:
    """``metrics``: metric label -> mode -> values (seconds). Writes a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
