"""Progress of a command that runs several long runs (``bench``, ``simulate``) on stderr.

One bar over all runs and one over the current run's steps, and one line per finished run with
the elapsed time: a log (CI, ``| tee``, nohup) gets no live bar, and a terminal keeps the lines
above it. Disabled, it draws and prints nothing.
"""

from __future__ import annotations

import time


class ProgressBars:
    """The two bars and the lines (module docstring)."""

    def __init__(self, enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True, disable=not enabled,
        )
        self.runs = self.progress.add_task("runs", total=1)
        self.steps = self.progress.add_task("steps", total=1, visible=False)
        self.enabled, self.clock = enabled, time.monotonic
        self.began = self.run_began = self.clock()
        self.done = self.total = 0

    def line(self, text: str) -> None:
        """``text`` on its own line, after the time since the start."""
        if self.enabled:
            self.progress.console.print(f"[{self.clock() - self.began:5.0f} s] {text}", highlight=False, markup=False)

    def __enter__(self) -> ProgressBars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def start(self, total_runs: int) -> None:
        self.total = total_runs
        self.progress.update(self.runs, total=total_runs, completed=0)

    def phase(self, text: str) -> None:
        """Work between runs: the runs bar says it, and a line."""
        self.progress.update(self.runs, description=text)
        self.line(text)

    def run_started(self, description: str, steps: str, total_steps: int = 1) -> None:
        """A run begins: ``description`` on the runs bar; the steps bar counts ``steps``."""
        self.run_began = self.clock()
        self.progress.update(self.runs, description=description)
        self.progress.update(self.steps, description=f"  {steps}", completed=0, total=max(total_steps, 1),
                             visible=True)

    def step_done(self, done: int, known: int | None = None) -> None:
        """``done`` steps of the run, of ``known`` so far (None: the total given at its start)."""
        self.progress.update(self.steps, completed=done, total=None if known is None else max(known, done, 1))

    def run_finished(self, what: str) -> None:
        """A line: ``what`` is done, in how long, and which run of how many it was."""
        self.done += 1
        self.line(f"{what}: done in {self.clock() - self.run_began:.1f} s (run {self.done} of {self.total})")
        self.progress.advance(self.runs)
        self.progress.update(self.steps, visible=False)
