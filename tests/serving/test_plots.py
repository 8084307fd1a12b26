"""bench-serve's per-rank Gantt: one time scale for every mode's panel, and a colour legend."""

from __future__ import annotations

from pathlib import Path

from sglang_vpp.serving.plots import rank_gantt_figure, write_rank_gantt


def _spans(num_micro_batches: int, duration: float) -> dict[int, list[tuple[float, float, int, int]]]:
    spans: dict[int, list[tuple[float, float, int, int]]] = {0: [], 1: []}
    for i in range(num_micro_batches):
        spans[0].append((i * duration, (i + 1) * duration, 0, i))
        spans[1].append(((i + 1) * duration, (i + 2) * duration, 1, i))
    return spans


def test_gantt_panels_share_one_time_axis_and_show_the_colours(tmp_path: Path):
    fig = rank_gantt_figure({"cpp": _spans(6, 0.05), "vpp-pack": _spans(10, 0.02)})
    top, bottom = fig.axes[:2]
    # The shorter run (vpp-pack, 0.22 s) is drawn on the longer one's scale (cpp, 0.35 s).
    assert top.get_xlim() == bottom.get_xlim() and bottom.get_xlim()[1] >= 0.35
    legend = top.get_legend()
    assert legend is not None and len(legend.get_texts()) == 10
    write_rank_gantt({"cpp": _spans(3, 0.1)}, tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0
