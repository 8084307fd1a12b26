"""``RunPlan``: how ``bench-serve`` loads one server (workload per repeat, warm-up, one pass)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .client import RequestResult, Summary, run_requests, summarize
from .workload import BenchRequest, BenchServeError, Workload, make_workload, random_ids

__all__ = ["RunPlan"]




@dataclass(frozen=True)
class RunPlan:
    """How to load a server: the workload (rebuilt per repeat) and the client's settings."""

    workload: Workload
    num_requests: int
    input_len: int
    output_len: int
    concurrency: int
    request_rate: float = math.inf
    timeout: float = 600.0
    seed: int = 0
    warmup: int = 1
    vocab_size: int = 10000
    max_input_len: int | None = None
    file: Path | None = None
    progress: bool = True

    def requests(self, repeat: int = 0) -> list[BenchRequest]:
        """The measured requests. Each repeat draws fresh token ids (seed + repeat) so no repeat is
        served from the radix cache of the one before; a file's explicit ids or texts repeat as given."""
        requests = make_workload(
            self.workload, self.num_requests, self.input_len, self.output_len, seed=self.seed + repeat,
            vocab_size=self.vocab_size, max_input_len=self.max_input_len, file=self.file,
        )  # fmt: skip
        return requests[: self.num_requests] if self.workload == Workload.FILE and self.num_requests else requests

    def warm_up(self, url: str) -> int:
        """Send ``warmup`` requests (not measured) shaped like the first one but with their own token
        ids, so the measured prompt is not already in the server's prefix cache. Returns how many."""
        if self.warmup <= 0:
            return 0
        first = self.requests()[0]
        warm = []
        for i in range(self.warmup):
            rng = random.Random(f"warmup-{self.seed}-{i}")
            if first.input_ids is not None:
                ids = random_ids(rng, len(first.input_ids), self.vocab_size)
                warm.append(BenchRequest(-1 - i, 2, input_ids=ids))
            else:
                warm.append(BenchRequest(-1 - i, 2, text=f"warm-up {i}: {first.text}"))
        results, _ = run_requests(url, warm, concurrency=1, timeout=self.timeout)
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise BenchServeError(f"warm-up request to {url} failed: {failed[0]}; is the server up?")
        return self.warmup

    def run(self, url: str, repeat: int = 0) -> tuple[Summary, list[RequestResult]]:
        """One measured pass of the workload against ``url``, with a progress bar."""
        from rich.progress import Progress

        requests = self.requests(repeat)
        with Progress(disable=not self.progress, transient=False) as bar:
            task = bar.add_task(f"bench-serve {self.workload} {url}", total=len(requests))
            results, wall = run_requests(
                url, requests, concurrency=self.concurrency, request_rate=self.request_rate,
                timeout=self.timeout, seed=self.seed + repeat, on_done=lambda _r: bar.advance(task),
            )  # fmt: skip
        return summarize(results, wall), results

    def describe(self) -> dict[str, Any]:
        requests = self.requests()
        return {
            "workload": str(self.workload), "num_requests": len(requests), "concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            "seed": self.seed, "warmup": self.warmup,
            "input_lens": [r.input_len for r in requests],
            "output_len": requests[0].output_len if requests else None,
        }  # fmt: skip
