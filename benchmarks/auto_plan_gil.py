"""Benchmark: what a busy Python loop loses while an ``auto`` plan runs beside it.

A server started with ``--chunked-prefill-size auto`` plans each situation after the first off
rank 0's scheduler loop (``vpp/chunk_sizing.AutoSituation``). This measures, in one process, a
pure-Python stand-in for that loop (iterations of a small dict/list workload, counted) while one
plan of a realistic situation runs:

- ``none``: no plan, the loop alone (for ``--idle-s`` seconds);
- ``thread``: the plan on a worker thread of the loop's process (``plan_process.ThreadPlanner``);
- ``process``: the plan in a child process (``plan_process.ProcessPlanner``, started and warmed
  before the first repeat, as a server starts it with its first situation), at the server's
  niceness (``PLANNER_NICENESS``: the loop runs first where the two share a CPU);
- ``process, nice 0``: the same child at the loop's priority.

The loop counts from the plan's submit until its answer is ready, and that span is the plan's
wall time. Each repeat plans a situation not planned before (vpp-stream, P = 8, DeepSeek-V3.1's
61 layers on the ascend-910c analytic estimate, 16 to 32 prompts of 4K to 30K), the same
situations for both planners. Prints a markdown table: loop iterations per second and plan wall
time, min / median / max over the repeats.

    python benchmarks/auto_plan_gil.py                 # 5 repeats
    python benchmarks/auto_plan_gil.py --json benchmarks/results/auto_plan_gil.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import Future
from typing import Callable

from sglang_vpp.plan_process import PLANNER_NICENESS, ProcessPlanner, ThreadPlanner, sizer_bytes
from sglang_vpp.schedule import build_controller, build_layout, server_controller_config
from sglang_vpp.schedule.auto_size import SERVER_CAP
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model

MODE = "vpp-stream"
PP = 8
MODEL = "deepseek-v3.1"
HARDWARE = "ascend-910c"


def server_controller():
    """The controller an ``auto`` prefill server builds (``VppState.build_controller``), on the preset."""
    model = load_model(MODEL)
    cost = AnalyticCostModel(model, load_hardware(HARDWARE))
    layout = build_layout(PP, model.num_layers, "foldback")
    return build_controller(server_controller_config(MODE, layout, SERVER_CAP, cost, auto_chunk=True, decodes=False))


def situation(repeat: int) -> tuple[int, ...]:
    """Repeat ``repeat``'s prompt lengths: 16 to 32 prompts of 4K to 30K (seeded)."""
    rng = random.Random(1000 + repeat)
    return tuple(rng.randint(4096, 30 * 1024) for _ in range(16 + 4 * (repeat % 5)))


def loop_step(state: dict) -> None:
    """One turn of the stand-in loop: some dict and list operations, as a scheduler turn makes."""
    queue = state["queue"]
    for item in range(16):
        queue.append(item)
        state[item] = state.get(item, 0) + len(queue)
    del queue[:16]


def busy_loop(stop: list) -> tuple[int, float]:
    """(iterations, seconds) of the loop run until ``stop`` holds something. The same cheap check
    ends every variant, set from another thread (a timer, or the plan's done callback)."""
    state: dict = {"queue": []}
    count = 0
    start = time.perf_counter()
    while not stop:
        loop_step(state)
        count += 1
    return count, time.perf_counter() - start


def while_planning(submit: Callable[[tuple[int, ...]], Future], lengths: tuple[int, ...]) -> tuple[float, float]:
    """(loop iterations per second, plan wall s) with one plan of ``lengths`` running beside the loop."""
    stop: list = []
    answer = submit(lengths)
    answer.add_done_callback(stop.append)
    count, spent = busy_loop(stop)
    answer.result()
    return count / spent, spent


def alone(seconds: float) -> float:
    stop: list = []
    timer = threading.Timer(seconds, stop.append, args=(True,))
    timer.start()
    count, spent = busy_loop(stop)
    timer.join()
    return count / spent


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=1.5, help="seconds of each no-plan repeat")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be >= 3 (the table reports min / median / max)")

    load_before = os.getloadavg()[0]  # a shared machine's other work moves every number here
    controller = server_controller()
    threads = ThreadPlanner(controller)
    planners = {"thread": threads,
                f"process, nice {PLANNER_NICENESS}": ProcessPlanner(sizer_bytes(controller.chunker.sizer)),
                "process, nice 0": ProcessPlanner(sizer_bytes(controller.chunker.sizer), niceness=0)}
    try:
        for planner in planners.values():  # started and imported, as a serving child is
            planner.submit((4096,) * 4).result(timeout=300)
        rates: dict[str, list[float]] = {"none": [], **{name: [] for name in planners}}
        walls: dict[str, list[float]] = {name: [] for name in planners}
        answers: dict[str, list] = {name: [] for name in planners}
        for repeat in range(args.repeats):
            lengths = situation(repeat)
            rates["none"].append(alone(args.idle_s))
            for name, planner in planners.items():
                rate, wall = while_planning(planner.submit, lengths)
                rates[name].append(rate)
                walls[name].append(wall)
                answers[name].append(planner.submit(lengths).result(timeout=300).chunk_size)  # cached: instant
        assert all(sizes == answers["thread"] for sizes in answers.values()), answers
    finally:
        for planner in planners.values():
            planner.close()

    load_after = os.getloadavg()[0]
    base = statistics.median(rates["none"])
    print(f"{MODE}, P = {PP}, {MODEL} ({HARDWARE} analytic estimate), {args.repeats} situations of 16-32 prompts "
          f"of 4K-30K; loop = a pure-Python stand-in for rank 0's scheduler loop; {os.cpu_count()} CPUs, "
          f"load average {load_before:.1f} before, {load_after:.1f} after\n")
    print("| plan | loop iterations/s (min / median / max) | median vs no plan | plan wall s (min / median / max) |")
    print("|---|---|---|---|")
    for name in rates:
        lo, mid, hi = spread(rates[name])
        wall = "-" if name == "none" else "%.2f / %.2f / %.2f" % spread(walls[name])
        print(f"| {name} | {lo / 1e3:.0f}K / {mid / 1e3:.0f}K / {hi / 1e3:.0f}K | {mid / base:.0%} | {wall} |")
    print(f"\nchosen sizes (equal for every planner): {answers['thread']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cpus": os.cpu_count(), "load_average": [load_before, load_after], "rates": rates, "walls": walls, "sizes": answers["thread"],
                       "situations": [list(situation(r)) for r in range(args.repeats)]}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
