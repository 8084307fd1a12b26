"""``sim.decode.estimate_decode`` on hand-checked cases: one second per layer per forward."""

import pytest

from sglang_vpp.schedule import StageCostModel
from sglang_vpp.sim.decode import decode_micro_batch, estimate_decode


class PerLayer(StageCostModel):
    """A forward costs 1 s per layer of the stage, whatever it carries; hops cost ``hop`` s."""

    def __init__(self, hop: float = 0.0) -> None:
        self.hop = hop

    def stage_cost(self, stage, chunk):
        return float(stage.num_layers)

    def transfer_cost(self, stage, chunk):
        return self.hop


def test_stock_pp_one_forward_per_rank_per_micro_batch():
    # P = 2, 8 layers: 2 stages of 4. 4 requests over 2 slots; a round: each rank runs 2 forwards
    # of 4 s = 8 s, and a trip is 8 s with 2 in flight: 8 s per token.
    e = estimate_decode("cpp", 2, 8, PerLayer(), running=4, context=100)
    assert (e.slots, e.requests_per_micro_batch, e.forwards_per_round) == (2, 2, 2)
    assert e.rank_round_s == e.trip_s == e.itl_s == 8.0


def test_fold_back_runs_two_forwards_per_micro_batch_over_more_slots():
    # vpp-async: 4 stages of 2 layers, 3 slots; a round: 3 micro-batches x 2 stages x 2 s = 12 s
    # per rank, (2P-1)/P = 1.5 times stock PP's 8 s.
    e = estimate_decode("vpp-async", 2, 8, PerLayer(), running=6, context=100)
    assert (e.slots, e.requests_per_micro_batch, e.forwards_per_round) == (3, 2, 6)
    assert (e.rank_round_s, e.trip_s, e.itl_s) == (12.0, 8.0, 12.0)
    # vpp-pack and vpp-stream keep 2(2P-1) = 6 slots: 24 s per round.
    for mode in ("vpp-pack", "vpp-stream"):
        e = estimate_decode(mode, 2, 8, PerLayer(), running=6, context=100)
        assert (e.slots, e.requests_per_micro_batch, e.itl_s) == (6, 1, 24.0)


def test_few_requests_use_few_slots_and_trips_can_bound():
    # One request: one slot, one micro-batch crossing 4 stages and 2 hops of 3 s: 8 + 6 = 14 s.
    e = estimate_decode("vpp-async", 2, 8, PerLayer(hop=3.0), running=1, context=0)
    assert (e.slots, e.rank_round_s, e.trip_s, e.itl_s, e.bound) == (1, 4.0, 14.0, 14.0, "trips in flight")
    # vpp-pack: 6 slots but only 2P-1 = 3 decode micro-batches in flight: two trips per round.
    e = estimate_decode("vpp-pack", 2, 8, PerLayer(hop=3.0), running=6, context=0)
    assert (e.rank_round_s, e.trip_s, e.itl_s) == (24.0, 14.0, 28.0)


def test_decode_micro_batch_and_errors():
    chunk = decode_micro_batch(3, 50)
    assert chunk.total_tokens == 3 and [p.start for p in chunk.parts] == [50, 50, 50]
    with pytest.raises(ValueError, match="running requests"):
        estimate_decode("cpp", 2, 8, PerLayer(), running=0, context=10)
