"""Rank programs that need a real GPU or NPU (run by tests/device through the launcher)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sglang_vpp.comm import CommConfig, create_communicator


def _expected(device: torch.device, size: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(1234)
    a = torch.randn(size, size, generator=generator)
    return (a @ a).to(device)


def producer_kernel_then_isend(rank: int, world_size: int, backend: str, size: int = 4096) -> dict[str, Any]:
    """Rank 0 sends the output of a matmul the moment it is enqueued (still running on the device);
    rank 1 must receive the finished product, on its own device."""
    with create_communicator(backend, CommConfig(timeout_s=60.0)) as comm:
        device = comm.backend.device
        result: dict[str, Any] = {"device": str(device), "ids": sorted(comm.communicator_ids().values())}
        if rank == 0:
            generator = torch.Generator(device="cpu").manual_seed(1234)
            a = torch.randn(size, size, generator=generator).to(device)
            product = a @ a  # enqueued on the current stream; not finished when isend returns
            handle = comm.isend({"product": product}, 1, "fwd")
            result["host_not_blocked"] = not handle.is_ready()
            handle.wait()
        else:
            got = comm.recv(0, "fwd")["product"]
            result["received_on"] = str(got.device)
            result["exact"] = bool(torch.equal(got, _expected(device, size)))
        dist.barrier()
    return result


def both_directions_overlap(rank: int, world_size: int, backend: str, mib: int = 256) -> dict[str, Any]:
    """Large transfers in both directions at once on the two groups complete and are exact."""
    with create_communicator(backend, CommConfig(timeout_s=120.0)) as comm:
        device = comm.backend.device
        numel = mib * (1 << 20) // 2
        mine = torch.full((numel,), float(rank + 1), dtype=torch.bfloat16, device=device)
        peer = 1 - rank
        out_group, in_group = ("fwd", "bwd") if rank == 0 else ("bwd", "fwd")
        sent = comm.isend({"x": mine}, peer, out_group)
        got = comm.recv(peer, in_group)["x"]
        sent.wait()
        exact = bool(torch.all(got == float(peer + 1)).item())
        dist.barrier()
    return {"exact": exact}
