"""The deep-pipeline claim of docs/simulator.md: DeepSeek-V3.1, 512K tokens, Ascend 910C.

vpp-taper at or below both CPP and DCPP at P = 2, 4, 8 for every chunk size from 8K to 64K, and
within 5 % of the run's makespan lower bound (the smallest bound over every mode and chunk size)
at its best chunk size.
"""

from __future__ import annotations

import pytest

from sglang_vpp.sim.config import SimConfig
from sglang_vpp.sim.cost.analytic import AnalyticCostModel
from sglang_vpp.sim.preset_loader import load_hardware, load_model
from sglang_vpp.sim.sweep import simulate_matrix
from sglang_vpp.sim.workloads import long_workload

CHUNKS = [8192, 16384, 24576, 32768, 65536]


@pytest.fixture(scope="module")
def deepseek():
    model = load_model("deepseek-v3.1")
    return model, AnalyticCostModel(model, load_hardware("ascend-910c"))


@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_vpp_taper_keeps_its_lead_on_deep_pipelines(deepseek, num_ranks):
    model, cost = deepseek
    rows = simulate_matrix(long_workload([512 * 1024]), cost, model.num_layers, "cpp,dcpp,vpp-pack,vpp-taper", CHUNKS,
                           num_ranks, sim=SimConfig(record_timeline=False))
    makespan = {(r.result.mode, r.result.chunk_size): r.result.sim.makespan_s for r in rows}
    for chunk in CHUNKS:
        rival = min(makespan[("cpp", chunk)], makespan[("dcpp", chunk)])
        assert makespan[("vpp-taper", chunk)] <= rival, (num_ranks, chunk, makespan)
    bound = min(r.result.lower_bound_s for r in rows)
    best = min(makespan[("vpp-taper", chunk)] for chunk in CHUNKS)
    assert best <= 1.05 * bound, (num_ranks, best, bound)
