"""Rank programs of the conformance suite: ``fn(rank, world_size, backend, ...) -> dict``.

Each runs inside a rank process started by ``launcher.run_ranks`` (default gloo world group
already initialised), builds a communicator on ``backend`` (a spec such as ``gloo``, ``nccl``,
``hccl@double``), exercises one property and returns a small picklable summary that the test
asserts on. Expected failures (negative controls) are caught here and returned as
``error_summary`` dicts with the elapsed time, so the test can check both the class and the speed.

After a failure a rank meets the others at a world barrier before closing, so that no rank tears
its links down while a peer still waits on them (which would turn a clean timeout on the peer
into a "peer gone" error).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..communicator import Communicator, create_communicator
from ..config import CommConfig
from ..errors import CommError
from ..message import SUPPORTED_DTYPES

__all__ = [
    "error_summary", "roundtrip_cases", "same_message", "roundtrip", "exchange_single_group",
    "schedule_pattern", "blocking_single_group", "dead_peer", "stuck_peer", "stress", "teardown",
    "selftest",
]


def error_summary(error: BaseException, started: float) -> dict[str, Any]:
    summary = {"type": type(error).__name__, "message": str(error), "elapsed_s": time.monotonic() - started}
    if isinstance(error, CommError):
        summary.update({k: v for k, v in error.context().items() if k != "detail"})
    return summary


def _barrier(timeout_s: float = 30.0) -> None:
    # A fresh gloo group: the world group's default timeout may be long, this one is bounded.
    work = dist.barrier(async_op=True)
    work.wait(timedelta(seconds=timeout_s))


def _communicator(backend: str, **config: Any) -> Communicator:
    return create_communicator(backend, CommConfig(**config))


def _negative_config(timeout_s: float) -> dict[str, Any]:
    """Config of a run expected to get stuck: every rank's own wait must report it. The transport
    outlives those waits by far, so that no rank's transport aborts the link (which its peer would
    see as "peer gone") before a rank that got stuck later has timed out by itself."""
    return {"timeout_s": timeout_s, "transport_timeout_s": timeout_s + 20.0}


# ---------------------------------------------------------------------------------------- round trip
def _filled(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point or dtype.is_complex:
        base = torch.randn(shape, generator=generator, dtype=torch.float64) * 3
        return base.to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return torch.randint(low, high, shape, generator=generator, dtype=torch.int64).to(dtype)


def roundtrip_cases() -> list[tuple[str, dict[str, Any]]]:
    """Every dtype and shape the runtime sends, plus edge cases; deterministic on every rank."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for index, (name, dtype) in enumerate(sorted(SUPPORTED_DTYPES.items())):
        for shape in [(3, 5), (), (0,), (2, 0, 3), (7,)]:
            cases.append((f"{name}{list(shape)}", {"t": _filled(dtype, shape, index * 10 + len(shape))}))
    rows, hidden = 16, 64
    hidden_states = _filled(torch.bfloat16, (rows, hidden), 1)
    cases.append(("runtime-message", {
        "hidden_states": hidden_states,
        "residual": _filled(torch.bfloat16, (rows, hidden), 2),
        "positions": torch.arange(rows, dtype=torch.int64) + 4096,
        "meta": {"request_index": 3, "chunk_index": 7, "stage_index": 2, "is_last": False, "scale": 0.5},
    }))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40], dtype=torch.float32)
    cases.append(("special-floats", {"f32": special, "bf16": special.to(torch.bfloat16),
                                     "f16": special.to(torch.float16)}))
    cases.append(("non-contiguous", {"t": _filled(torch.float32, (4, 6), 3).t(),
                                     "s": _filled(torch.int32, (10,), 4)[::3]}))
    cases.append(("requires-grad", {"t": _filled(torch.float32, (3,), 5).requires_grad_()}))
    cases.append(("metadata-only", {"m": {"a": [1, 2.5, None, True, "üñí"], "b": {"c": []}}, "n": None}))
    cases.append(("empty-dict", {}))
    cases.append(("long-header", {f"key_{i:03d}": i for i in range(300)} | {"t": torch.ones(2)}))
    cases.append(("large-4MiB", {"t": _filled(torch.float32, (1 << 20,), 6)}))
    return cases


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same_message(received: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """None if bit-identical (dtype, shape, bytes, metadata), else what differs."""
    if list(received) != list(expected):
        return f"keys {list(received)} != {list(expected)}"
    for key, want in expected.items():
        got = received[key]
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                return f"{key}: got {type(got).__name__}, expected a tensor"
            if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
                return f"{key}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
            if _tensor_bytes(got) != _tensor_bytes(want):
                return f"{key}: bytes differ"
        elif json.dumps(got, sort_keys=True) != json.dumps(want, sort_keys=True):
            return f"{key}: metadata {got!r} != {want!r}"
    return None


def roundtrip(rank: int, world_size: int, backend: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """Rank 0 sends every case on ``fwd``; rank 1 checks it and echoes it back on ``bwd``."""
    cases = roundtrip_cases()
    problems: list[str] = []
    with _communicator(backend, timeout_s=timeout_s) as comm:
        if rank == 0:
            sends = [comm.isend(message, 1, "fwd", action=f"send:{name}") for name, message in cases]
            for name, message in cases:
                echoed = comm.recv(1, "bwd", action=f"recv-echo:{name}")
                diff = same_message(echoed, message)
                if diff:
                    problems.append(f"echo of {name}: {diff}")
            comm.wait_all(sends)
        elif rank == 1:
            # Every receive posted up front (their headers are pre-posted), echoes sent as they come.
            receives = [comm.irecv(0, "fwd", action=f"recv:{name}") for name, _ in cases]
            echoes = []
            for (name, message), handle in zip(cases, receives, strict=True):
                got = handle.wait()
                diff = same_message(got, message)
                if diff:
                    problems.append(f"{name}: {diff}")
                echoes.append(comm.isend(got, 0, "bwd", action=f"echo:{name}"))
            comm.wait_all(echoes)
        _barrier()
    return {"cases": len(cases), "problems": problems}


def exchange_single_group(rank: int, world_size: int, backend: str, rounds: int = 50,
                          timeout_s: float = 20.0) -> dict[str, Any]:
    """Both ranks of each pair ``exchange`` on one group: batched send+recv must not block."""
    problems: list[str] = []
    with _communicator(backend, group_names=("pp",), timeout_s=timeout_s) as comm:
        peers = [p for p in (rank - 1, rank + 1) if 0 <= p < world_size]
        for i in range(rounds):
            for peer in sorted(peers):  # lower pair first on every rank: one global order
                mine = {"x": torch.full((i % 5 + 1,), float(rank * 100000 + i)), "from": rank, "i": i}
                got = comm.exchange(mine, peer, "pp", action=f"exchange#{i}<>{peer}").wait()
                want = {"x": torch.full((i % 5 + 1,), float(peer * 100000 + i)), "from": peer, "i": i}
                diff = same_message(got, want)
                if diff:
                    problems.append(f"round {i} with {peer}: {diff}")
        _barrier()
    return {"rounds": rounds, "problems": problems}


# ---------------------------------------------------------------------------------------- schedules
def schedule_pattern(rank: int, world_size: int, backend: str, policy: str = "vpp-async", num_chunks: int = 64,
                     single_group: bool = False, semantics: str = "async", timeout_s: float = 20.0) -> dict[str, Any]:
    """Walk this rank's actions of ``build_schedule(policy, P, ...)`` with 64 chunks.

    ``single_group`` maps every group onto one ``pp`` group (the negative control)."""
    from sglang_vpp.schedule import RequestSpec, build_schedule

    from .schedule_walk import walk_rank

    chunk_size = 16
    schedule = build_schedule(policy, world_size, 4 * world_size, [RequestSpec(num_chunks * chunk_size)], chunk_size)
    groups = ("pp",) if single_group else tuple(schedule.groups)
    group_map = {g: "pp" for g in schedule.groups} if single_group else None
    started = time.monotonic()
    result: dict[str, Any] = {"groups": groups, "num_chunks": len(schedule.chunks), "error": None}
    comm = _communicator(backend, group_names=groups, **_negative_config(timeout_s))
    try:
        report = walk_rank(comm, schedule.rank_actions[rank], semantics=semantics, group_map=group_map,
                           timeout_s=timeout_s)
        result.update(completed=True, sent=report.num_sent, received=report.num_received,
                      mismatches=report.mismatches)
    except CommError as error:
        result.update(completed=False, error=error_summary(error, started))
    result["elapsed_s"] = time.monotonic() - started
    _barrier(timeout_s=max(30.0, 3 * timeout_s))
    comm.close(drain=result["completed"])
    return result


def blocking_single_group(rank: int, world_size: int, backend: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """Negative control: both ranks do a blocking send to each other on one group, then receive.

    Per communicator, operations pair in issue order: each send waits for a receive that the peer
    only posts after its own send. Must end in ``CommTimeoutError`` within ``timeout_s``."""
    peer = 1 - rank
    result: dict[str, Any] = {"completed": False, "error": None}
    with _communicator(backend, group_names=("pp",), **_negative_config(timeout_s)) as comm:
        started = time.monotonic()
        try:
            comm.send({"x": torch.ones(4)}, peer, "pp", action=f"{rank}SEND_F0.0>{peer}@pp")
            comm.recv(peer, "pp", action=f"{rank}RECV_F0.0<{peer}@pp")
            result["completed"] = True
        except CommError as error:
            result["error"] = error_summary(error, started)
        _barrier()
        comm.close(drain=False)
    return result


# ---------------------------------------------------------------------------------------- failures
def dead_peer(rank: int, world_size: int, backend: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """Rank 1 exits abruptly after set-up; rank 0's receive and send must raise ``PeerDeadError``."""
    comm = _communicator(backend, timeout_s=timeout_s)
    _barrier()
    if rank == 1:
        os._exit(17)  # no close, no goodbye: a crash
    time.sleep(0.3)
    result: dict[str, Any] = {}
    started = time.monotonic()
    try:
        comm.recv(1, "fwd", action="0RECV_F0.0<1@fwd")
        result["recv"] = None
    except CommError as error:
        result["recv"] = error_summary(error, started)
    started = time.monotonic()
    try:
        comm.send({"x": torch.ones(3)}, 1, "bwd", action="0SEND_F0.0>1@bwd")
        result["send"] = None
    except CommError as error:
        result["send"] = error_summary(error, started)
    comm.close(drain=False)
    return result


def stuck_peer(rank: int, world_size: int, backend: str, timeout_s: float = 1.5) -> dict[str, Any]:
    """Rank 1 stays alive but never sends; rank 0's receive must time out naming the operation."""
    result: dict[str, Any] = {}
    with _communicator(backend, **_negative_config(timeout_s)) as comm:
        if rank == 0:
            started = time.monotonic()
            handle = comm.irecv(1, "fwd", action="1RECV_F3.2<0@fwd")
            try:
                handle.wait()
                result["error"] = None
            except CommError as error:
                result["error"] = error_summary(error, started)
            result["ready_after_timeout"] = handle.is_ready()
        _barrier()
        comm.close(drain=False)
    return result


# ---------------------------------------------------------------------------------------- stress
def _stress_message(index: int) -> dict[str, Any]:
    size = 1 + (index * 7919) % 61
    values = (torch.arange(size, dtype=torch.int64) * 2654435761 + index) % 1000003
    tensor = values.to(torch.int32)
    return {"seq": index, "crc": zlib.crc32(_tensor_bytes(tensor)), "data": tensor}


def stress(rank: int, world_size: int, backend: str, num_messages: int = 10_000, window: int = 128,
           timeout_s: float = 30.0) -> dict[str, Any]:
    """``num_messages`` alternate directions: even 0 -> 1 on ``fwd``, odd 1 -> 0 on ``bwd``.

    Every message carries its index and a CRC32 of its payload; the receiver checks the index
    (nothing lost or reordered within a group), the CRC and the exact contents. Up to ``window``
    operations per rank are in flight."""
    problems: list[str] = []
    received = 0
    messages = [_stress_message(i) for i in range(num_messages)]  # the expected contents, made once
    started, cpu_started = time.monotonic(), time.process_time()
    with _communicator(backend, timeout_s=timeout_s) as comm:
        inflight: list[tuple[int, Any]] = []

        def settle(limit: int) -> None:
            nonlocal received
            while len(inflight) > limit:
                index, handle = inflight.pop(0)
                got = handle.wait()
                if got is None:
                    continue
                received += 1
                want = messages[index]
                if got["seq"] != index:
                    problems.append(f"expected message {index}, got {got['seq']}")
                elif zlib.crc32(_tensor_bytes(got["data"])) != got["crc"] or got["crc"] != want["crc"] \
                        or not torch.equal(got["data"], want["data"]):
                    problems.append(f"message {index}: checksum or contents differ")

        for index in range(num_messages):
            sender = index % 2
            group = "fwd" if sender == 0 else "bwd"
            if rank == sender:
                inflight.append((index, comm.isend(messages[index], 1 - rank, group, action=f"stress#{index}")))
            else:
                inflight.append((index, comm.irecv(sender, group, action=f"stress#{index}")))
            settle(window)
            if len(problems) > 10:
                break
        settle(0)
        _barrier()
    return {"received": received, "problems": problems[:10], "elapsed_s": time.monotonic() - started,
            "cpu_s": time.process_time() - cpu_started}


# ---------------------------------------------------------------------------------------- lifecycle
def teardown(rank: int, world_size: int, backend: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """Create, close, re-create; close with operations pending; use after close."""
    result: dict[str, Any] = {}
    first = _communicator(backend, timeout_s=timeout_s)
    result["first_ids"] = sorted(first.communicator_ids().values())
    first.close()
    second = _communicator(backend, timeout_s=timeout_s)
    peer = 1 - rank
    got = second.exchange({"r": rank}, peer, "fwd").wait()
    result["exchange_ok"] = got == {"r": peer}
    _barrier()
    pending = [second.irecv(peer, "bwd", action=f"never#{i}") for i in range(3)]  # the peer never sends
    time.sleep(0.2)
    started = time.monotonic()
    second.close(drain=False)
    result["close_s"] = time.monotonic() - started
    result["pending_errors"] = [type(h.exception()).__name__ for h in pending]
    result["pending_ready"] = [h.is_ready() for h in pending]
    try:
        second.isend({"x": 1}, peer, "fwd")
        result["after_close"] = None
    except CommError as error:
        result["after_close"] = type(error).__name__
    _barrier()
    return result


def selftest(rank: int, world_size: int, backend: str, timeout_s: float = 20.0,
             num_messages: int = 50) -> dict[str, Any]:
    """The doctor's 2-rank check: distinct groups, both directions at once, exact data, latency."""
    with _communicator(backend, timeout_s=timeout_s) as comm:
        peer = 1 - rank
        ids = comm.communicator_ids()
        mine = {"hidden_states": torch.full((4, 8), float(rank)), "meta": {"rank": rank}}
        # Both directions at once, each on its own group: the fold-back pattern in miniature.
        out_group, in_group = ("fwd", "bwd") if rank == 0 else ("bwd", "fwd")
        sent = comm.isend(mine, peer, out_group)
        got = comm.recv(peer, in_group)
        sent.wait()
        expected = torch.full((4, 8), float(peer))
        data_ok = torch.equal(got["hidden_states"].cpu(), expected) and got["meta"] == {"rank": peer}
        started = time.monotonic()
        for i in range(num_messages):
            if rank == 0:
                comm.send({"i": i, "x": torch.ones(16)}, peer, "fwd")
                comm.recv(peer, "bwd")
            else:
                comm.send(comm.recv(peer, "fwd"), peer, "bwd")
        round_trip_s = (time.monotonic() - started) / num_messages
        _barrier()
    return {"communicators": {f"{g}<->{p}": cid for (g, p), cid in ids.items()}, "data_ok": bool(data_ok),
            "round_trip_us": round_trip_s * 1e6, "backend": backend}
