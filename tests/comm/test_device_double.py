"""The device double enforces the documented NCCL/HCCL semantics (it must be able to say no)."""

from __future__ import annotations

import time

import pytest

from comm_support import launch
from sglang_vpp.comm.errors import DeviceSemanticsError
from sglang_vpp.comm.testing.device_double import DoubleDeviceApi, DoubleHcclOptions, DoubleStream


def test_hccl_options_hand_out_a_copy_like_the_pybind_property() -> None:
    options = DoubleHcclOptions()
    options.hccl_config["group_name"] = "lost"  # edits a copy, as with torch_npu
    assert options.hccl_config == {}
    options.hccl_config = {"group_name": "kept"}
    assert options.hccl_config == {"group_name": "kept"}


def test_stream_runs_in_order_and_errors_stick() -> None:
    api = DoubleDeviceApi("nccl")
    stream = DoubleStream("t")
    seen: list[int] = []
    before, after = api.new_event(), api.new_event()
    stream.submit(lambda: (time.sleep(0.05), seen.append(1)))
    before.record(stream)
    stream.submit(lambda: seen.append(2))

    def fail() -> None:
        raise DeviceSemanticsError(detail="synthetic device error")

    stream.submit(fail)
    stream.submit(lambda: seen.append(3))  # skipped: the stream is poisoned
    after.record(stream)
    before.synchronize()
    assert before.query() and seen[:1] == [1]
    with pytest.raises(DeviceSemanticsError, match="synthetic"):
        after.synchronize()
    with pytest.raises(DeviceSemanticsError):
        after.query()
    assert seen == [1, 2]
    assert api.new_event().query()  # never recorded: complete, as on CUDA


def test_other_stream_waits_for_an_event() -> None:
    api = DoubleDeviceApi("hccl")
    producer, consumer = DoubleStream("p"), DoubleStream("c")
    order: list[str] = []
    producer.submit(lambda: (time.sleep(0.1), order.append("produce")))
    ready = api.new_event()
    ready.record(producer)
    consumer.wait_event(ready)
    consumer.submit(lambda: order.append("consume"))
    consumer.synchronize()
    assert order == ["produce", "consume"]


def test_device_count_and_set_device() -> None:
    api = DoubleDeviceApi("nccl", device_count=2)
    assert api.device_count() == 2 and len(api.device_names()) == 2
    api.set_device(1)
    with pytest.raises(DeviceSemanticsError, match="out of range"):
        api.set_device(2)


@pytest.mark.parametrize("flavour", ["nccl", "hccl"])
def test_out_of_order_pairing_is_refused(flavour: str) -> None:
    values = launch("rank_programs:double_pairing_violation", 2, flavour, launch_timeout_s=60.0).values()
    error = values[1]["error"]
    assert error is not None and error["type"] == "DeviceSemanticsError", values
    assert "receive #0 posted for 32 bytes" in error["message"] and "16 bytes" in error["message"]
    assert "in issue order" in error["message"]


@pytest.mark.parametrize("flavour", ["nccl", "hccl"])
def test_send_holds_its_stream_until_the_receive_is_posted(flavour: str) -> None:
    values = launch("rank_programs:double_send_waits_for_receive", 2, flavour, delay_s=0.6,
                    launch_timeout_s=60.0).values()
    assert values[0]["pending_midway"] is True
    assert values[0]["completed_after_s"] >= 0.55


def test_hccl_registry_merges_identical_options_and_refuses_long_names() -> None:
    values = launch("rank_programs:double_group_registry", 2, launch_timeout_s=60.0).values()
    for value in values:
        assert value["plain_merged"] is True  # the hazard the notes warn about, reproduced
        assert value["named_merged"] is False and value["names"] == ["vpp_fwd_0_1", "vpp_bwd_0_1"]
        assert value["too_long"] == "DeviceSemanticsError"
        assert value["nccl_merged"] is False
