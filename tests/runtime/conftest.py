"""Shared fixtures: rank pools (one start-up for many runs) and a reference cache."""

from __future__ import annotations

import pytest
import torch
from sglang_vpp.runtime.launcher import PoolSpec, RankPool
from sglang_vpp.runtime.models import resolve_model
from sglang_vpp.runtime.reference import RequestOutput, max_abs_diff, reference_forward, within_fp32_rounding
from sglang_vpp.runtime.spec import Timeouts
from sglang_vpp.schedule import ChunkSpec

#: Short enough that a broken run fails the test quickly, long enough for a loaded 2-vCPU host.
TEST_TIMEOUTS = Timeouts(comm_s=60.0, control_s=60.0, startup_s=180.0, run_s=240.0, grace_s=5.0)


@pytest.fixture(scope="module")
def pool2():
    with RankPool(PoolSpec(2, timeouts=TEST_TIMEOUTS)) as pool:
        yield pool


@pytest.fixture(scope="module")
def pool3():
    with RankPool(PoolSpec(3, timeouts=TEST_TIMEOUTS)) as pool:
        yield pool


@pytest.fixture(scope="module")
def pool4():
    with RankPool(PoolSpec(4, timeouts=TEST_TIMEOUTS)) as pool:
        yield pool


@pytest.fixture
def timeouts() -> Timeouts:
    return TEST_TIMEOUTS


@pytest.fixture
def matches_reference():
    """``matches_reference(result)``: see ``assert_matches_reference``."""
    return assert_matches_reference


def assert_matches_reference(result, tol: float = 1e-5) -> float:
    """Outputs of a launched run vs the single-process reference with the same chunks (exact),
    and vs the whole-prompt forward (rounding only). Returns the exact-reference difference."""
    spec = result.spec
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        source = resolve_model(spec.model, spec.seed, spec.num_layers)
        lengths = [r.length for r in spec.requests]
        chunks = [ChunkSpec(*c) for c in result.reports[0].chunks]
        same_chunks = reference_forward(source, lengths, chunks=chunks, token_seed=spec.seed).outputs
        whole = reference_forward(source, lengths, None, token_seed=spec.seed).outputs
    finally:
        torch.set_num_threads(threads)
    got = [RequestOutput(k, h, l) for k, (h, l) in sorted(result.outputs.items())]
    assert len(got) == len(lengths)
    exact = max_abs_diff(got, same_chunks)
    assert exact <= tol, f"{spec.mode}: max abs diff {exact} vs the same-chunk reference"
    rounding = max_abs_diff(got, whole)
    assert within_fp32_rounding(rounding, *(t for o in whole for t in (o.hidden, o.logits))), (
        f"{spec.mode}: differs from the whole-prompt forward by {rounding}")
    return exact
