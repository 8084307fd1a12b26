"""A decoding burst against one served VPP mode: wall time, decode micro-batches per decode
step and the token gaps of requests that could not join a decode slot, from ``--vpp-trace``.

Starts one server (tiny 8-layer Qwen2 built locally, ``--pp-size 2``), sends ``--bursts``
bursts of ``--requests`` fresh prompts of ``--prompt-len`` tokens at once, each streaming
``--new-tokens`` greedy tokens, and stops the server. Per burst: wall time, median TTFT and
ITL, and from rank 0's records the burst's decode micro-batches over its decode steps
(``new_tokens - 1``: the first token comes from prefill) and the slots they ran in. The
requests whose prefill ended while no decode slot was open (a ``decode`` record with no slot
chosen at that prefill's result) are listed apart with their first and all token gaps. Runs
under the shared server lock on a shared host; compare two checkouts by running it with each
on PYTHONPATH (docs/cpu-measurements.md "Holding requests that cannot join a decode slot").

    flock /tmp/sglang-server.lock python benchmarks/decode_burst.py --mode vpp-pack --chunk 64
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_vpp.models.tiny_hf import TinyModelSpec, build_tiny_model
from sglang_vpp.serving.launcher import ServerConfig, SGLangServer
from sglang_vpp.trace_records import BUILDS


def stream(url: str, ids: list[int], rid: str, new_tokens: int) -> list[float]:
    """Arrival time of each generated token, seconds from the request's start."""
    body = {"input_ids": ids, "rid": rid, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    request = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    start, times = time.monotonic(), []
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                count = len(json.loads(line[5:]).get("output_ids") or [])
                times += [time.monotonic() - start] * (count - len(times))
    return times


def burst_decode(records: dict, rids: set[str]) -> dict:
    """The burst's decode micro-batches, their slots, and the requests whose prefill ended
    with no decode slot open (held, or decoded in place by a loop without holds)."""
    decisions = records["decisions"]
    slot = {build["seq"]: build["slot"] for build in records[BUILDS]}
    admits = {rec["seq"]: rec for rec in decisions if rec["kind"] == "admit" and set(rec["requests"]) & rids}
    decode = [seq for seq, rec in admits.items() if not rec["prefill"]]
    waited: set[str] = set()
    # A result's decode record comes right before its "left" record (Replica.apply_result).
    for rec, after in zip(decisions, decisions[1:]):
        if (rec["kind"] == "decode" and rec["chosen"] is None and after["kind"] == "left"
                and after["seq"] in admits and slot[after["seq"]] == rec["from_slot"]):
            later = {rid for seq, a in admits.items() if seq > after["seq"] and a["prefill"] for rid in a["requests"]}
            waited |= set(admits[after["seq"]]["requests"]) - later
    return {"decode_micro_batches": len(decode), "slots": sorted({slot[seq] for seq in decode}),
            "waited": sorted(waited & rids)}


def spread(values: list[float], scale: float = 1.0) -> str:
    """min/median/max; milliseconds (``scale`` 1e3) without decimals, seconds with two."""
    if not values:
        return "none"
    digits = 0 if scale >= 1e3 else 2
    return "/".join(f"{v * scale:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="vpp-pack")
    parser.add_argument("--chunk", default="64", help="--chunked-prefill-size (a number or auto)")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="decode-burst-"))
    model = build_tiny_model(work / "model", TinyModelSpec("qwen2-tiny", num_layers=8))
    trace = work / "trace"
    config = ServerConfig(model_dir=str(model), pp_size=2, pp_mode=args.mode, chunked_prefill_size=args.chunk,
                          extra_args=("--vpp-trace", str(trace)))
    server = SGLangServer(config, work / "server.log")
    server.start(timeout=600)
    walls, steps, ttft, itl, first_waited, gaps_waited = [], [], [], [], [], []
    try:
        for burst in range(args.bursts):
            rng = random.Random(1000 + burst)
            prompts = [[rng.randrange(2, 10000) for _ in range(args.prompt_len)] for _ in range(args.requests)]
            rids = [f"b{burst}-{i}" for i in range(args.requests)]
            start = time.monotonic()
            with ThreadPoolExecutor(args.requests) as pool:
                times = dict(zip(rids, pool.map(lambda p: stream(server.url, p[0], p[1], args.new_tokens),
                                                zip(prompts, rids))))
            walls.append(time.monotonic() - start)
            records = _records_with(trace / "vpp_rank0.records.json", set(rids))
            found = burst_decode(records, set(rids))
            steps.append(found["decode_micro_batches"] / (args.new_tokens - 1))
            ttft += [t[0] for t in times.values()]
            itl += [b - a for t in times.values() for a, b in zip(t, t[1:])]
            first_waited += [times[rid][1] - times[rid][0] for rid in found["waited"]]
            gaps_waited += [b - a for rid in found["waited"] for a, b in zip(times[rid], times[rid][1:])]
            print(f"burst {burst}: {walls[-1]:.2f} s, {steps[-1]:.2f} decode micro-batches"
                  f" per step in slots {found['slots']}, {len(found['waited'])} waited")
    finally:
        server.stop()
    print(f"{args.mode} chunk {args.chunk}, min/median/max over {args.bursts} bursts:")
    print(f"  burst wall s {spread(walls)}; decode micro-batches/step {spread(steps)}")
    print(f"  TTFT s {spread(ttft)}; ITL ms {spread(itl, 1e3)}")
    print(f"  waited requests' gaps ms: first {spread(first_waited, 1e3)},"
          f" all {spread(gaps_waited, 1e3)}")


def _records_with(path: Path, rids: set[str], timeout_s: float = 60.0) -> dict:
    """Rank 0's records once they hold the burst and every admitted micro-batch has left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            data = json.loads(path.read_text())
            kinds = [rec["kind"] for rec in data["decisions"]]
            if kinds.count("admit") == kinds.count("left") and any(
                    set(rec.get("requests", ())) & rids for rec in data["decisions"]):
                return data
        time.sleep(0.5)
    raise TimeoutError(f"{path} did not record the burst within {timeout_s:.0f} s")


if __name__ == "__main__":
    main()
