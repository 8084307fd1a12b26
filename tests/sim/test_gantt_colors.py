"""The Gantt legend is unambiguous: transfer colours are not among the chunk colours."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from sglang_vpp.sim import trace  # noqa: E402


def test_send_colours_differ_from_every_chunk_colour():
    chunk_colours = {mcolors.to_hex(plt.get_cmap("tab20")(i)) for i in range(20)}
    sends = {mcolors.to_hex(trace._SEND_FWD_COLOR), mcolors.to_hex(trace._SEND_BWD_COLOR)}
    assert len(sends) == 2 and not sends & chunk_colours
