"""Benchmark: what the ``auto`` planner process costs to start, in a parent that imported SGLang.

A server's scheduler process has SGLang's launcher module as its ``__main__``. This script
stands in for it: run as a file, it imports ``sglang.launch_server`` at its top, as that module
does, then starts ``plan_process.ProcessPlanner`` for the sizer of a server's ``auto`` controller
(vpp-pack, P = 2, 8 layers: its plans take milliseconds), ``--repeats`` times, one child at a
time. For each it measures the wall time from the constructor to the first answer (the child's
start and one plan) and the child's resident memory then (``VmRSS``), and prints min / median /
max. Any ``ProcessPlanner`` with that interface can be measured: put the tree to measure first
on ``PYTHONPATH``.

    python benchmarks/planner_start.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sglang.launch_server  # noqa: F401  (what a server's __main__ imports)

import sglang_vpp.plan_process as measured
from sglang_vpp.plan_process import ProcessPlanner, sizer_bytes
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.sglang_plugin.vpp.state import VppConfig, VppState


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _one_start(pickled: bytes) -> tuple[float, float, float]:
    """Seconds the constructor held the caller, seconds to the first answer, the child's MB then."""
    started = time.perf_counter()
    planner = ProcessPlanner(pickled)
    constructed = time.perf_counter() - started
    try:
        planner.submit((300, 5000)).result(timeout=300)
        return constructed, time.perf_counter() - started, _rss_mb(planner.pid)
    finally:
        planner.close()


def _spread(values: list[float], unit: str) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} {unit}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    state = VppState(config=VppConfig(mode="vpp-pack", pp_size=2, auto_chunk=True, on_cpu=True), rank=0)
    state.ensure_layout(8)
    pickled = sizer_bytes(state.build_controller(SERVER_CAP, decodes=False).chunker.sizer)
    runs = [_one_start(pickled) for _ in range(args.repeats)]


    print(f"planner: {measured.__file__}")
    print(f"parent resident: {_rss_mb(os.getpid()):.0f} MB")
    spread = f"(min / median / max of {args.repeats})"
    print(f"constructor, the caller waits {spread}: {_spread([1000 * c for c, _, _ in runs], 'ms')}")
    print(f"start to first answer {spread}: {_spread([t for _, t, _ in runs], 's')}")
    print(f"child resident then {spread}: {_spread([m for _, _, m in runs], 'MB')}")


if __name__ == "__main__":
    main()
