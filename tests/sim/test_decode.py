"""``sim.decode.estimate_decode`` on hand-checked cases: one second per layer per forward."""

import pytest

from sglang_vpp.schedule import StageCostModel
from sglang_vpp.sim.decode import decode_micro_batch, estimate_decode


class PerLayer(StageCostModel):
    """A forward costs 1 s per layer of the stage plus ``fixed`` s, whatever it carries; hops
    cost ``hop`` s."""

    def __init__(self, hop: float = 0.0, fixed: float = 0.0) -> None:
        self.hop = hop
        self.fixed = fixed

    def stage_cost(self, stage, chunk):
        return float(stage.num_layers) + self.fixed

    def transfer_cost(self, stage, chunk):
        return self.hop


def test_stock_pp_one_forward_per_rank_per_micro_batch():
    # P = 2, 8 layers: 2 stages of 4. 4 requests over 2 slots; a round: each rank runs 2 forwards
    # of 4 s = 8 s, and a trip is 8 s with 2 in flight: 8 s per token.
    e = estimate_decode("cpp", 2, 8, PerLayer(), running=4, context=100)
    assert (e.slots, e.requests_per_micro_batch, e.forwards_per_round) == (2, 2, 2)
    assert e.rank_round_s == e.trip_s == e.itl_s == 8.0


def test_fold_back_spread_over_all_slots_runs_two_forwards_per_micro_batch_over_more_slots():
    # vpp-async: 4 stages of 2 layers, 3 slots; a round: 3 micro-batches x 2 stages x 2 s = 12 s
    # per rank, (2P-1)/P = 1.5 times stock PP's 8 s.
    e = estimate_decode("vpp-async", 2, 8, PerLayer(), running=6, context=100, all_slots=True)
    assert (e.slots, e.requests_per_micro_batch, e.forwards_per_round) == (3, 2, 6)
    assert (e.rank_round_s, e.trip_s, e.itl_s) == (12.0, 8.0, 12.0)
    # vpp-pack and vpp-stream keep 2(2P-1) = 6 slots: 24 s per round.
    for mode in ("vpp-pack", "vpp-stream"):
        e = estimate_decode(mode, 2, 8, PerLayer(), running=6, context=100, all_slots=True)
        assert (e.slots, e.requests_per_micro_batch, e.itl_s) == (6, 1, 24.0)


def test_few_requests_use_few_slots_and_trips_can_bound():
    # One request: one slot, one micro-batch crossing 4 stages and 2 hops of 3 s: 8 + 6 = 14 s.
    e = estimate_decode("vpp-async", 2, 8, PerLayer(hop=3.0), running=1, context=0)
    assert (e.slots, e.rank_round_s, e.trip_s, e.itl_s, e.bound) == (1, 4.0, 14.0, 14.0, "trips in flight")
    # vpp-pack: 6 slots but only 2P-1 = 3 decode micro-batches in flight: two trips per round.
    # vpp-stream alike: its 2(2P-1) window opens for prefill micro-batches of uneven cost only.
    for mode in ("vpp-pack", "vpp-stream"):
        e = estimate_decode(mode, 2, 8, PerLayer(hop=3.0), running=6, context=0, all_slots=True)
        assert (e.slots, e.rank_round_s, e.trip_s, e.itl_s) == (6, 24.0, 14.0, 28.0), mode


@pytest.mark.parametrize("mode", ["vpp", "vpp-async", "vpp-pack", "vpp-taper", "vpp-stream"])
def test_decode_slots_are_stock_pp_count_so_only_the_per_forward_cost_differs(mode):
    # P = 2, 8 layers, 16 requests: 2 decode micro-batches of 8 in every mode. cpp: 2 stages of
    # 4 layers, a forward 4 + f s; a round is 2 micro-batches x 1 forward: 8 + 2f. Fold-back: 4
    # stages of 2, a forward 2 + f; a round is 2 micro-batches x 2 forwards: 8 + 4f. The same
    # layers per token; fold-back pays P = 2 more per-forward costs per round.
    for fixed in (0.0, 0.5):
        cpp = estimate_decode("cpp", 2, 8, PerLayer(fixed=fixed), running=16, context=100)
        vpp = estimate_decode(mode, 2, 8, PerLayer(fixed=fixed), running=16, context=100)
        assert (vpp.slots, vpp.requests_per_micro_batch, vpp.forwards_per_round) == (2, 8, 4)
        assert (cpp.itl_s, vpp.itl_s) == (8.0 + 2 * fixed, 8.0 + 4 * fixed)
        assert vpp.itl_s - cpp.itl_s == 2 * fixed


def test_decode_slots_at_p4_and_a_trip_bound_pays_the_extra_hops():
    # P = 4, 16 layers, 8 requests: 4 micro-batches of 2. cpp: stages of 4 layers, forwards
    # 4 + 1 = 5 s, a round 4 x 5 = 20 s; trip 4 x 5 + 3 hops x 1 s = 23 s (4 in flight): 23 s.
    # vpp-pack: stages of 2 layers, forwards 3 s, a round 4 x 2 x 3 = 24 s; trip 8 x 3 + 6 hops
    # = 30 s: 30 s, 7 s more: the 4 extra forwards of a trip (1 s each) and the 3 extra hops.
    cpp = estimate_decode("cpp", 4, 16, PerLayer(hop=1.0, fixed=1.0), running=8, context=0)
    vpp = estimate_decode("vpp-pack", 4, 16, PerLayer(hop=1.0, fixed=1.0), running=8, context=0)
    assert (cpp.slots, cpp.rank_round_s, cpp.trip_s, cpp.itl_s) == (4, 20.0, 23.0, 23.0)
    assert (vpp.slots, vpp.rank_round_s, vpp.trip_s, vpp.itl_s) == (4, 24.0, 30.0, 30.0)
    # Spread over vpp-pack's 14 slots instead: 8 micro-batches of 1, 7 in flight.
    spread = estimate_decode("vpp-pack", 4, 16, PerLayer(hop=1.0, fixed=1.0), running=8, context=0, all_slots=True)
    assert (spread.slots, spread.rank_round_s, spread.itl_s) == (8, 48.0, 48.0)


def test_decode_micro_batch_and_errors():
    chunk = decode_micro_batch(3, 50)
    assert chunk.total_tokens == 3 and [p.start for p in chunk.parts] == [50, 50, 50]
    with pytest.raises(ValueError, match="running requests"):
        estimate_decode("cpp", 2, 8, PerLayer(), running=0, context=10)
