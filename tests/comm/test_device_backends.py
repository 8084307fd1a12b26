"""The NCCL and HCCL backends' own code, run on the gloo device double."""

from __future__ import annotations

import pytest

from comm_support import launch
from sglang_vpp.comm.base import LinkSpec
from sglang_vpp.comm.errors import CommConfigError, CommError, CommTimeoutError, PeerDeadError
from sglang_vpp.comm.testing.device_double import DoubleDeviceApi, DoubleHcclOptions


def _hccl(**kwargs):
    from sglang_vpp_ascend.hccl import HcclBackend

    return HcclBackend(api=DoubleDeviceApi("hccl"), **kwargs)


def test_hccl_group_names_are_distinct_per_direction_and_short() -> None:
    backend = _hccl()
    names = {backend.group_name_for(LinkSpec(g, (a, a + 1))) for g in ("fwd", "bwd", "pp") for a in range(64)}
    assert len(names) == 3 * 64 and all(len(n) <= 32 for n in names)
    long = _hccl(name_prefix="a_rather_long_prefix_for_hccl")
    name = long.group_name_for(LinkSpec("fwd", (1000, 1001)))
    assert len(name) <= 32 and name != long.group_name_for(LinkSpec("bwd", (1000, 1001)))


def test_hccl_options_carry_name_and_buffer_size() -> None:
    backend = _hccl(hccl_buffer_size_mb=256)
    options = backend.pg_options(LinkSpec("bwd", (2, 3)))
    assert isinstance(options, DoubleHcclOptions)
    assert options.hccl_config == {"group_name": "vpp_bwd_2_3", "hccl_buffer_size": 256}
    assert "hccl_buffer_size" not in _hccl().pg_options(LinkSpec("fwd", (0, 1))).hccl_config
    with pytest.raises(AssertionError):  # one name for two specs would let a registry merge them
        backend._issued_names["vpp_fwd_9_10"] = LinkSpec("bwd", (0, 1))
        backend.pg_options(LinkSpec("fwd", (9, 10)))
    with pytest.raises(CommConfigError, match="positive integer"):
        _hccl(hccl_buffer_size_mb=0)


def test_nccl_options_ask_for_a_high_priority_stream() -> None:
    from sglang_vpp_cuda.nccl import NcclBackend

    assert NcclBackend(api=DoubleDeviceApi("nccl")).pg_options(LinkSpec("fwd", (0, 1))).is_high_priority_stream
    assert not NcclBackend(api=DoubleDeviceApi("nccl"), high_priority_stream=False).pg_options(
        LinkSpec("fwd", (0, 1))).is_high_priority_stream


@pytest.mark.parametrize("name", ["nccl", "hccl"])
def test_device_errors_are_classified(name: str) -> None:
    from sglang_vpp_ascend.hccl import HcclBackend
    from sglang_vpp_cuda.nccl import NcclBackend

    backend = {"nccl": NcclBackend, "hccl": HcclBackend}[name](api=DoubleDeviceApi(name))
    gone = {"nccl": "NCCL error: remote process exited or there was a network error",
            "hccl": "HCCL function error: link down between ranks"}[name]
    assert isinstance(backend.classify_error(RuntimeError(gone), 5.0), PeerDeadError)
    timeout = backend.classify_error(RuntimeError(f"{name} watchdog: operation timed out"), 5.0)
    assert isinstance(timeout, CommTimeoutError) and timeout.timeout_s == 5.0
    other = backend.classify_error(RuntimeError("invalid argument"), 5.0)
    assert type(other) is CommError and name in str(other)


def test_hccl_communicators_are_named_per_direction() -> None:
    values = launch("rank_programs:hccl_distinct_names", 2, buffer_mb=128, launch_timeout_s=60.0).values()
    assert values[0]["ids"] == {"fwd<->1": "vpp_fwd_0_1", "bwd<->1": "vpp_bwd_0_1"}
    assert values[1]["ids"] == {"fwd<->0": "vpp_fwd_0_1", "bwd<->0": "vpp_bwd_0_1"}
    assert values[0]["configs"]["bwd<->1"] == {"group_name": "vpp_bwd_0_1", "hccl_buffer_size": 128}


def test_identical_hccl_options_are_caught_as_one_shared_communicator() -> None:
    values = launch("rank_programs:hccl_identical_options_alias", 2, launch_timeout_s=60.0).values()
    for rank, value in enumerate(values):
        error = value["error"]
        assert error is not None and error["type"] == "CommunicatorAliasError", value
        assert "'fwd' and 'bwd'" in error["message"] and error["rank"] == rank and error["peer"] == 1 - rank
        assert "group_name" in error["message"]  # the fix


def test_two_ranks_on_one_device_are_refused_with_the_reason() -> None:
    result = launch("sglang_vpp.comm.testing.scenarios:selftest", 2, "nccl@double", launch_timeout_s=60.0,
                    env={"SGLANG_VPP_DOUBLE_DEVICES": "1"})
    assert not result.ok
    for outcome in result.outcomes:
        assert outcome.error_type == "BackendUnavailableError", outcome.traceback
        assert "refuses two ranks on one GPU" in str(outcome.error)


@pytest.mark.parametrize("backend", ["nccl@double", "hccl@double"])
def test_send_waits_for_the_producer_stream(backend: str) -> None:
    values = launch("rank_programs:producer_stream_is_respected", 2, backend, launch_timeout_s=60.0).values()
    assert values[1]["received"] == [7.0, 7.0, 7.0, 7.0]
