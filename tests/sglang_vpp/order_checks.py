"""A traced server's order against the simulator's and the runtime planner's on the same workload
and cost table (``replan.py`` replans it; docs/sglang-vpp.md, "Same order as the simulator and
the runtime")."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from replan import replan
from sglang_harness import SGLangServer
from vpp_checks import CHUNK, generate, make_prompts, wait_for_json

from sglang_vpp.serving.decision_replay import compare_decisions, load_trace, server_workload


ORDER_LENGTHS = (4 * CHUNK, CHUNK, 3 * CHUNK, 2 * CHUNK)
"""Chunked and unchunked prompts whose lengths divide the chunk size, with one-token answers: every
micro-batch is one request's prefill chunk, which the planner can express."""


def traced_order_load(server: SGLangServer, num_ranks: int, out_dir: Path) -> Path:
    """Send ``ORDER_LENGTHS`` at once to an idle server; write the trace of that load alone (seqs
    from 0, as a fresh controller numbers them) to ``out_dir``."""
    before = [_num_decisions(server.trace_dir / f"vpp_rank{r}.records.json") for r in range(num_ranks)]
    num_micro_batches = sum(ORDER_LENGTHS) // CHUNK
    rids = [f"order-{i}" for i in range(len(ORDER_LENGTHS))]
    threads = [threading.Thread(target=generate, args=(server, ids, 1), kwargs={"rid": rid})
               for ids, rid in zip(make_prompts(ORDER_LENGTHS, seed=31), rids)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    leader = wait_for_json(server.trace_dir / "vpp_rank0.records.json", timeout=60,
                           until=lambda d: sum(r["kind"] == "left" for r in d["decisions"][before[0]:]) >= num_micro_batches)
    segment = leader["decisions"][before[0]:]
    first = min(r["seq"] for r in segment if r["kind"] == "admit")
    last = max(r["seq"] for r in segment if r["kind"] == "admit")
    out_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(num_ranks):
        data = wait_for_json(server.trace_dir / f"vpp_rank{rank}.records.json", timeout=60,
                             until=lambda d: max((r["seq"] for r in d["records"]), default=-1) >= last)
        decisions = [_renumber(r, first) for r in data["decisions"][before[rank]:]]
        (out_dir / f"vpp_rank{rank}.records.json").write_text(json.dumps(
            {"records": [], "controller": data["controller"], "decisions": decisions}))
    return out_dir


def _num_decisions(path: Path) -> int:
    """Decisions already written (ranks write at idle; a server that served nothing has no file)."""
    return len(json.loads(path.read_text())["decisions"]) if path.exists() else 0


def _renumber(record: dict, first: int) -> dict:
    record = dict(record)
    if "seq" in record:
        record["seq"] -= first
    if record["kind"] == "pick":
        record["ready"] = [[stage, seq - first] for stage, seq in record["ready"]]
        record["chosen"] = [record["chosen"][0], record["chosen"][1] - first]
    return record


def assert_planner_order_equals_the_server(server, pp, tmp_path, monkeypatch):
    """The server's decisions on a load, against the simulator's and the runtime planner's on the
    same workload and cost table: the same decision in the same situation (docs/sglang-vpp.md,
    "Same order as the simulator and the runtime")."""
    trace = traced_order_load(server, pp, tmp_path / "order")
    workload = server_workload(trace)
    assert sorted(workload.lengths) == sorted(ORDER_LENGTHS)
    recorders, sim_order, runtime_order = replan(workload, monkeypatch)
    assert sim_order == runtime_order
    assert recorders[0].decisions == recorders[1].decisions
    served = {rank: data["decisions"] for rank, data in load_trace(trace).items()}
    inputs = load_trace(trace)[0]["controller"]
    split_fold = "fold" not in inputs  # a fused fold is one stage: nothing runs "right after" it
    comparisons = [compare_decisions(served[rank], recorders[0].decisions[rank], rank, inputs,
                                     fold_stage=pp if rank == pp - 1 and split_fold else None) for rank in range(pp)]
    report = "\n".join(f"rank {c.rank}: {c.num_compared} of {c.num_decisions} decisions met in the planner too; "
                       f"{c.num_equal} records equal, then {c.event_difference}" for c in comparisons)
    assert all(c.divergence is None for c in comparisons), [c.divergence.describe() for c in comparisons if c.divergence]
    # The first admissions start from an empty pipeline on both sides, so they are always compared.
    assert comparisons[0].num_compared >= 2, report
    print(report)
