"""HCCL on real NPUs: distinct communicator names per direction, stream ordering, two-way traffic.

Skipped with the probe's reason where torch_npu or 2 NPUs are missing. The whole conformance
suite (tests/comm) also runs on ``hccl`` there; backends/ascend/run_conformance.sh runs both.
"""

from __future__ import annotations

import pytest

from comm_support import device_reason, launch

REASON = device_reason("hccl")
pytestmark = [pytest.mark.device, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def test_send_waits_for_the_producer_kernel_and_communicators_differ() -> None:
    values = launch("device_programs:producer_kernel_then_isend", 2, "hccl", size=2048,
                    launch_timeout_s=300.0).values()
    assert values[1]["exact"] and values[1]["received_on"] == "npu:1"
    ids = values[0]["ids"]
    assert len(set(ids)) == 2 and all(ids), ids  # get_hccl_comm_name differs per direction


def test_large_transfers_both_directions_at_once() -> None:
    values = launch("device_programs:both_directions_overlap", 2, "hccl", mib=64, launch_timeout_s=300.0).values()
    assert all(v["exact"] for v in values)
