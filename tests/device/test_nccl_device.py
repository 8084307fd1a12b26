"""NCCL on real GPUs: stream ordering, placement, communicator identity, large two-way traffic.

Skipped with the probe's reason where there is no CUDA or fewer than 2 GPUs. The whole
conformance suite (tests/comm) also runs on ``nccl`` there; backends/cuda/run_conformance.sh runs both.
"""

from __future__ import annotations

import pytest

from comm_support import device_reason, launch

REASON = device_reason("nccl")
pytestmark = [pytest.mark.device, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_send_waits_for_the_producer_kernel_and_lands_on_the_peer_gpu() -> None:
    values = launch("device_programs:producer_kernel_then_isend", 2, "nccl", launch_timeout_s=300.0).values()
    assert values[1]["exact"] and values[1]["received_on"] == "cuda:1"
    assert values[0]["ids"] == values[1]["ids"] and len(set(values[0]["ids"])) == 2
    assert all(cid.startswith("nccl:") for cid in values[0]["ids"])


def test_large_transfers_both_directions_at_once() -> None:
    values = launch("device_programs:both_directions_overlap", 2, "nccl", launch_timeout_s=300.0).values()
    assert all(v["exact"] for v in values)
