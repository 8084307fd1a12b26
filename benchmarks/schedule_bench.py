"""Scheduler microbenchmark: cost of producing one action, and of planning a 1M-token request.

The paper's small-model regression (Qwen 30B-A3B, up to -6.8% vs CPP on 4K-16K prompts) came from
scheduling overhead, so the planner must stay cheap. Target: under 20 microseconds per action in
pure Python. Reports min / median / max over repeats (wall clock of the planner alone, this
machine; the planner is single-threaded pure Python, so this is not a pipeline-speed claim).

    python benchmarks/schedule_bench.py [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sglang_vpp.schedule import RequestSpec, build_schedule, check_deadlock, validate_schedule

POLICIES = ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack"]


def _time(fn, repeats):
    samples = []
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return samples, result


def _spread(samples, scale=1.0):
    return {"min": min(samples) * scale, "median": statistics.median(samples) * scale, "max": max(samples) * scale}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    rows = []
    print(f"{'case':<34} {'actions':>8} {'us/action min/med/max':>26} {'plan s (median)':>16} {'check s':>8}")
    cases = [(p, 2, [RequestSpec(1 << 20)], 1024, "1M tokens, 1K chunks, P=2") for p in POLICIES]
    cases += [(p, 4, [RequestSpec(16384) for _ in range(100)], 8192, "100 x 16K, 8K chunks, P=4") for p in POLICIES]
    for policy, pp, requests, chunk, label in cases:
        samples, plan = _time(lambda: build_schedule(policy, pp, 48, requests, chunk), args.repeats)
        start = time.perf_counter()
        validate_schedule(plan)
        assert not check_deadlock(plan).deadlock
        check_s = time.perf_counter() - start
        per_action = _spread(samples, 1e6 / plan.num_actions)
        rows.append({"policy": policy, "case": label, "pp": pp, "actions": plan.num_actions,
                     "us_per_action": per_action, "plan_s": _spread(samples), "validate_and_check_s": check_s})
        print(f"{policy + ' ' + label:<34} {plan.num_actions:>8} "
              f"{per_action['min']:>8.2f}/{per_action['median']:>6.2f}/{per_action['max']:>6.2f}      "
              f"{statistics.median(samples):>12.4f} {check_s:>8.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"results": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
