"""``benchmarks/decode_burst.py``'s trace reading on hand-made rank 0 records."""

import pytest
from benchmark_scripts import load_benchmark


def _admit(seq, requests, prefill):
    return {"kind": "admit", "seq": seq, "requests": requests, "prefill": prefill}


def test_burst_decode_counts_decode_micro_batches_and_finds_requests_that_waited():
    burst = load_benchmark("decode_burst")
    # vpp-pack, P = 2: a and b end their prefill in slot 1 and join slot 0; c's prefill ends in
    # slot 2 while both decode slots are in flight (a hold at that result, then a join); d's
    # first chunk in slot 4 is followed by a second one, so it did not end there.
    decisions = [
        _admit(0, ["a", "b"], True), _admit(1, ["c", "d"], True), _admit(2, ["a", "b"], False),
        {"kind": "decode", "from_slot": 1, "running": [[0, 0]], "chosen": 0}, {"kind": "left", "seq": 0},
        _admit(3, ["d"], True),
        {"kind": "decode", "from_slot": 2, "running": [], "chosen": None}, {"kind": "left", "seq": 1},
        {"kind": "decode", "from_slot": 2, "running": [[0, 2]], "chosen": 0}, {"kind": "left", "seq": 2},
        _admit(4, ["a", "b", "c"], False), _admit(5, ["x"], False),
    ]
    builds = [{"seq": s, "slot": slot} for s, slot in ((0, 1), (1, 2), (2, 0), (3, 4), (4, 0), (5, 3))]
    found = burst.burst_decode({"decisions": decisions, "builds": builds}, {"a", "b", "c", "d"})
    assert found == {"decode_micro_batches": 2, "slots": [0], "waited": ["c"]}
    assert burst.spread([]) == "none" and burst.spread([0.1, 0.3, 0.2], 1e3) == "100/200/300"
