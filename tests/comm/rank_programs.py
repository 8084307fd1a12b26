"""Rank programs used only by tests (the conformance ones live in sglang_vpp.comm.testing.scenarios).

Each is ``fn(rank, world_size, ...) -> picklable``; ``comm_support.launch`` runs them in rank
processes with this directory and the backend distributions on ``sys.path``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from sglang_vpp.comm import CommConfig, create_communicator
from sglang_vpp.comm.errors import CommError
from sglang_vpp.comm.testing.device_double import DoubleDeviceApi
from sglang_vpp.comm.testing.scenarios import error_summary


# ---------------------------------------------------------------------------------------- launcher
def return_rank(rank: int, world_size: int) -> dict[str, int]:
    return {"rank": rank, "world_size": world_size, "local_rank": int(os.environ["LOCAL_RANK"])}


def hang_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        time.sleep(1000)
    return rank


def raise_comm_error(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        # As in exit_rank_one: a rank that raises (and exits) while its peer still connects fails
        # the peer inside gloo's set-up instead of with this error.
        dist.barrier()
    raise CommError(rank=rank, peer=1 - rank, group="fwd", action="0SEND_F1.0>1@fwd", detail="synthetic")


def exit_rank_one(rank: int, world_size: int) -> int:
    import torch.distributed as dist

    if dist.is_initialized():
        # Both ranks finish connecting first; otherwise rank 0 can fail inside gloo's connection
        # set-up and the test would measure that race instead of the exit report.
        dist.barrier()
    if rank == 1:
        os._exit(3)
    return rank


# ---------------------------------------------------------------------------------------- the double
def _double_group(api: DoubleDeviceApi, name: str = "vpp_test_0_1") -> Any:
    options = api.make_pg_options()
    if api.flavour == "hccl":
        options.hccl_config = {"group_name": name}
    return api.new_group([0, 1], timedelta(seconds=10), options, "test")


def double_pairing_violation(rank: int, world_size: int, flavour: str) -> dict[str, Any]:
    """Rank 0 sends 16 then 32 bytes; rank 1 receives 32 bytes first: the double must refuse."""
    api = DoubleDeviceApi(flavour)
    group = _double_group(api)
    stream = api.new_stream()
    event = api.new_event()
    with api.stream(stream):
        if rank == 0:
            api.isend(torch.ones(4), 1, group)
            api.isend(torch.ones(8), 1, group)
        else:
            api.irecv(torch.empty(8), 0, group)
        event.record(stream)
    started = time.monotonic()
    while True:
        try:
            if event.query():
                return {"error": None}
        except CommError as error:
            return {"error": error_summary(error, started)}
        if time.monotonic() - started > 8:
            return {"error": "no verdict"}
        time.sleep(0.01)


def double_send_waits_for_receive(rank: int, world_size: int, flavour: str, delay_s: float = 0.6) -> dict[str, Any]:
    """A posted send's event stays pending until the peer posts the receive ``delay_s`` later."""
    api = DoubleDeviceApi(flavour)
    group = _double_group(api)
    stream = api.new_stream()
    dist.barrier()
    if rank == 1:
        time.sleep(delay_s)
        received = api.new_event()
        with api.stream(stream):
            api.irecv(torch.empty(4), 0, group)
            received.record(stream)
        received.synchronize()  # work.wait() only orders streams; the host waits on an event
        return {}
    done = api.new_event()
    started = time.monotonic()
    with api.stream(stream):
        api.isend(torch.ones(4), 1, group).wait()
        done.record(stream)
    pending_midway = None
    while not done.query():
        if pending_midway is None and time.monotonic() - started > delay_s / 2:
            pending_midway = True
        time.sleep(0.005)
    return {"completed_after_s": time.monotonic() - started, "pending_midway": pending_midway}


def double_group_registry(rank: int, world_size: int) -> dict[str, Any]:
    """HCCL flavour: identical options merge into one communicator; distinct names do not."""
    api = DoubleDeviceApi("hccl")
    timeout = timedelta(seconds=10)
    plain_a = api.new_group([0, 1], timeout, api.make_pg_options(), "a")
    plain_b = api.new_group([0, 1], timeout, api.make_pg_options(), "b")
    named_fwd = _double_group(api, "vpp_fwd_0_1")
    named_bwd = _double_group(api, "vpp_bwd_0_1")
    too_long = None
    try:
        _double_group(api, "x" * 33)
    except CommError as error:
        too_long = type(error).__name__
    nccl = DoubleDeviceApi("nccl")
    n1 = nccl.new_group([0, 1], timeout, nccl.make_pg_options(), "n1")
    n2 = nccl.new_group([0, 1], timeout, nccl.make_pg_options(), "n2")
    return {"plain_merged": plain_a is plain_b, "named_merged": named_fwd is named_bwd,
            "names": [api.communicator_name(g, rank) for g in (named_fwd, named_bwd)],
            "too_long": too_long, "nccl_merged": n1 is n2}


# ---------------------------------------------------------------------------------------- backends
def hccl_identical_options_alias(rank: int, world_size: int) -> dict[str, Any]:
    """An HCCL backend that gives both directions identical options: the check must refuse it."""
    from sglang_vpp_ascend.hccl import HcclBackend

    class SameOptions(HcclBackend):
        def pg_options(self, spec: Any) -> Any:
            return self.api.make_pg_options()  # no group_name: the registry may merge the groups

    started = time.monotonic()
    try:
        create_communicator(SameOptions(api=DoubleDeviceApi("hccl")), CommConfig(timeout_s=5.0)).close()
        return {"error": None}
    except CommError as error:
        return {"error": error_summary(error, started)}


def hccl_distinct_names(rank: int, world_size: int, buffer_mb: int | None = None) -> dict[str, Any]:
    from sglang_vpp_ascend.hccl import HcclBackend

    backend = HcclBackend(api=DoubleDeviceApi("hccl"), hccl_buffer_size_mb=buffer_mb)
    with create_communicator(backend, CommConfig(timeout_s=5.0)) as comm:
        ids = {f"{g}<->{p}": cid for (g, p), cid in comm.communicator_ids().items()}
        configs = {f"{g}<->{p}": link.data_group.options.hccl_config for (g, p), link in comm.links().items()}
        dist.barrier()
    return {"ids": ids, "configs": configs}


def producer_stream_is_respected(rank: int, world_size: int, backend: str) -> dict[str, Any]:
    """A tensor still being written on the producer's stream must be sent after the write."""
    with create_communicator(backend, CommConfig(timeout_s=10.0)) as comm:
        api = comm.backend.api
        if rank == 0:
            producer = api.new_stream()
            tensor = torch.zeros(4)

            def slow_write() -> None:
                time.sleep(0.3)
                tensor.fill_(7.0)

            with api.stream(producer):
                producer.submit(slow_write)  # a "kernel" still running when isend is called
                handle = comm.isend({"t": tensor}, 1, "fwd")
            handle.wait()
            result: dict[str, Any] = {}
        else:
            result = {"received": comm.recv(0, "fwd")["t"].tolist()}
        dist.barrier()
    return result
