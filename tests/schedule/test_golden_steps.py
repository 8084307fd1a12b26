"""Dry-run step counts and estimated makespans as regression numbers (tests/golden/*.csv).

Refresh after an intended change with ``pytest tests/schedule --update-golden`` and review the diff.
"""

import csv
from pathlib import Path

import pytest

from sglang_vpp.schedule import ActionKind, RequestSpec, build_schedule

GOLDEN = Path(__file__).parent.parent / "golden" / "schedule_steps.csv"
FIELDS = ["policy", "pp", "chunks", "requests", "actions", "computes", "sends", "max_rank_steps", "est_makespan"]


def _rows():
    rows = []
    for policy in ["cpp", "dcpp", "vpp", "vpp-async", "vpp-pack", "vpp-stream"]:
        for pp, chunks, requests in [(2, 8, 1), (2, 16, 3), (3, 12, 2), (4, 32, 1), (4, 9, 4)]:
            lengths = [RequestSpec(chunks * 512 - 100 * i) for i in range(requests)]
            plan = build_schedule(policy, pp, 8 * pp, lengths, 512)
            kinds = [a.kind for acts in plan.rank_actions for a in acts]
            rows.append({
                "policy": policy, "pp": pp, "chunks": chunks, "requests": requests,
                "actions": plan.num_actions,
                "computes": kinds.count(ActionKind.COMPUTE),
                "sends": kinds.count(ActionKind.SEND),
                "max_rank_steps": max(len(a) for a in plan.rank_actions),
                "est_makespan": f"{max(e.end for e in plan.timeline):.9g}",
            })
    return rows


def test_step_counts_match_golden(update_golden):
    rows = [{k: str(v) for k, v in row.items()} for row in _rows()]
    if update_golden:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        with GOLDEN.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        pytest.skip("golden file rewritten")
    # A missing golden is a failure: writing it here would make the test pass on any output.
    assert GOLDEN.exists(), f"{GOLDEN} is missing: create it with --update-golden and review it"
    with GOLDEN.open() as handle:
        golden = list(csv.DictReader(handle))
    assert rows == golden
