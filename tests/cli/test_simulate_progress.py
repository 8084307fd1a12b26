"""``simulate``'s progress: a line per finished run on stderr with ``--progress``, nothing without
a terminal unless asked; ``simulate_matrix`` tells its progress every run and completion."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.sim.sweep import SweepProgress, simulate_matrix
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.workloads import build_workload

_RUN = ["simulate", "--model", "qwen3-tiny", "--seq-len", "1k,2k", "--chunk-size", "512", "--modes", "cpp,vpp"]


def test_progress_prints_a_line_per_run_on_stderr():
    result = CliRunner().invoke(app, [*_RUN, "--progress"])
    assert result.exit_code == 0, result.output
    lines = [re.sub(r"done in [0-9.]+ s", "done", line.split("] ", 1)[1])
             for line in result.stderr.splitlines() if "] " in line]
    assert lines == [f"{length} prompts, {mode} at 512: done (run {i + 1} of 4)"
                     for i, (length, mode) in enumerate([("1k", "cpp"), ("1k", "vpp"), ("2k", "cpp"), ("2k", "vpp")])]
    assert "TTFT s" in result.stdout and "done in" not in result.stdout


def test_without_a_terminal_progress_is_off_unless_asked():
    for flags in ([], ["--no-progress"]):
        result = CliRunner().invoke(app, [*_RUN, *flags])
        assert result.exit_code == 0, result.output
        assert "done in" not in result.output


class _Recorded(SweepProgress):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def run_started(self, mode: str, size: str, num_requests: int) -> None:
        self.events.append(("start", mode, size, num_requests))

    def request_done(self, done: int) -> None:
        self.events.append(("done", done))

    def run_finished(self, mode: str, size: str) -> None:
        self.events.append(("end", mode, size))


def test_simulate_matrix_tells_each_run_and_each_completion():
    model = load_model("qwen3-tiny")
    cost = AnalyticCostModel(model, load_hardware("ascend-910c"))
    work = build_workload("mixed", num_requests=6, concurrency=2)
    progress = _Recorded()
    simulate_matrix(work, cost, model.num_layers, "cpp,vpp-stream", [2048, "auto"], 2, progress=progress)
    runs = [e for e in progress.events if e[0] != "done"]
    assert runs == [("start", "cpp", "2k", 6), ("end", "cpp", "2k"), ("start", "vpp-stream", "2k", 6),
                    ("end", "vpp-stream", "2k"), ("start", "cpp", "auto", 6), ("end", "cpp", "auto"),
                    ("start", "vpp-stream", "auto", 6), ("end", "vpp-stream", "auto")]
    # Between a run's start and end: the completions so far, rising to all of its requests.
    starts = [i for i, e in enumerate(progress.events) if e[0] == "start"] + [len(progress.events)]
    for begin, end in zip(starts, starts[1:]):
        counts = [e[1] for e in progress.events[begin:end] if e[0] == "done"]
        assert counts == sorted(counts) and counts[-1] == 6 and 1 <= counts[0]
