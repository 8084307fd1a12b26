"""The body of one rank process: start-up once, then one run per job, then a clean exit.

Data flow: ``launcher.RankPool`` spawns ``rank_main(rank, pool, ...)`` -> torch.distributed
rendezvous (a ``FileStore`` in the pool directory: no port to pick, nothing to collide with) ->
the comm abstraction's communicator with all three groups (``pp`` for cpp/dcpp/vpp, ``fwd`` and
``bwd`` for vpp-async/vpp-pack; created once, so runs of different modes share one start-up) ->
per job ``(run_id, RunSpec)``: this rank's share of the model, barrier + common epoch,
``RankExecutor.run``, outputs to a file, a ``RankReport`` -> ``None`` job: close and exit 0.

Messages on the result queue (picklable tuples, tagged with the run id; 0 before any job):
``("up", 0, rank)``, ``("ready", run, rank)``, ``("progress", run, rank, done, known)`` from the
rank holding the last stage, ``("report", run, rank, RankReport)``, ``("error", run, rank, text)``.
Any exception is reported as ``error`` and the process exits with code 1 at once (peers learn
through their comm errors or the launcher's abort); the pool is then unusable.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..parent_death import die_with_parent

__all__ = ["ALL_GROUPS", "rank_main"]

ALL_GROUPS = ("pp", "fwd", "bwd")


def _format_error(error: BaseException) -> str:
    from ..comm.errors import CommError
    from .executor import RunAborted

    if isinstance(error, (CommError, RunAborted, TimeoutError, ValueError)):
        return f"{type(error).__name__}: {error}"
    frames = traceback.format_exception(type(error), error, error.__traceback__)
    return f"{type(error).__name__}: {error}\n" + "".join(frames[-6:]).rstrip()


def rank_main(rank: int, pool: Any, pool_dir: str, jobs: Any, control_queues: list[Any],
              result_queue: Any, abort_event: Any, launcher_pid: int | None = None) -> None:
    """Entry point of rank ``rank`` (see the module docstring). ``launcher_pid``: the process
    that started this one (None: this process's parent now)."""
    die_with_parent()
    parent = os.getppid() if launcher_pid is None else launcher_pid
    if os.getppid() != parent:
        # The launcher died (e.g. SIGTERM from `timeout`) while this process was still importing,
        # before it asked to die with it: nothing will ever send it a job or stop it.
        os._exit(1)
    run_id = 0
    comm = None
    try:
        import torch
        import torch.distributed as dist

        from ..comm.communicator import create_communicator
        from ..comm.config import CommConfig

        torch.set_num_threads(pool.num_threads)
        dist.init_process_group(
            backend="gloo", init_method=f"file://{Path(pool_dir) / 'rendezvous'}", rank=rank,
            world_size=pool.num_ranks, timeout=timedelta(seconds=pool.timeouts.startup_s),
        )
        comm = create_communicator(pool.backend_name, CommConfig(group_names=ALL_GROUPS, timeout_s=pool.timeouts.comm_s))
        result_queue.put(("up", 0, rank))
        while True:
            job = _next_job(jobs, parent)
            if job is None:
                break
            run_id, spec = job
            _run_one(rank, run_id, spec, comm, Path(pool_dir), control_queues, result_queue, abort_event)
        comm.close(drain=True, timeout_s=pool.timeouts.comm_s)
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - every failure must reach the launcher
        result_queue.put(("error", run_id, rank, _format_error(error)))
        if comm is not None:
            comm.close(drain=False, timeout_s=0.0)
        result_queue.close()
        result_queue.join_thread()
        os._exit(1)
    result_queue.close()
    result_queue.join_thread()
    # Everything is reported and closed; skip the interpreter's slow teardown (seconds with torch
    # and the queues' finalizers), which would only delay the launcher's join.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _next_job(jobs: Any, parent: int) -> Any:
    """The next job; None to stop. Idle ranks poll so that an orphaned rank (launcher gone without
    PR_SET_PDEATHSIG, e.g. off Linux) notices and stops instead of waiting forever."""
    import queue as queue_module

    while True:
        try:
            return jobs.get(timeout=1.0)
        except queue_module.Empty:
            if os.getppid() != parent:
                return None


def _run_one(rank: int, run_id: int, spec: Any, comm: Any, pool_dir: Path, control_queues: list[Any],
             result_queue: Any, abort_event: Any) -> None:
    import torch
    import torch.distributed as dist

    from ..schedule import get_policy
    from .control import CoordinatorFeed, FollowerFeed, make_planner
    from .executor import RankExecutor
    from .models import materialize, resolve_model
    from .records import RankReport
    from .spec import Device

    policy = get_policy(spec.mode)
    source = resolve_model(spec.model, spec.seed, spec.num_layers)
    layout = spec.layout(source.config.num_hidden_layers)
    model = materialize(source, [layout.stages[s] for s in layout.stages_of(rank)], layout.num_stages)
    if spec.device is not Device.CPU:
        model = model.to(_device(spec.device, rank))
    planner = make_planner(spec, layout)
    # One epoch for all ranks: rank 0's clock once everyone is ready (perf_counter is system-wide).
    try:
        dist.barrier()
        box = [time.perf_counter()]
        dist.broadcast_object_list(box, src=0)
    except RuntimeError as error:
        raise _start_failure(error, rank, spec.timeouts.startup_s) from error
    epoch = box[0]
    ready_s = time.perf_counter() - epoch
    result_queue.put(("ready", run_id, rank))
    if rank == 0:
        followers = [_Tagged(q, run_id) for q in control_queues[1:]]
        # control_queues[0] is rank 0's inbox: the followers' completion reports.
        feed: Any = CoordinatorFeed(planner, [(r.length, r.arrival_s) for r in spec.requests], followers,
                                    epoch, reports=_Untagged(control_queues[0], run_id),
                                    timeout_s=spec.timeouts.control_s,
                                    report_self=_Tagged(control_queues[0], run_id))
    else:
        feed = FollowerFeed(rank, planner, _Untagged(control_queues[rank], run_id), spec.timeouts.control_s,
                            reports=_Tagged(control_queues[0], run_id))
    holds_last = layout.rank_of(layout.last_stage) == rank
    executor = RankExecutor(
        rank, layout, model, comm, feed, policy.comm_semantics, device=spec.device, timeouts=spec.timeouts,
        epoch=epoch, token_seed=spec.seed, prepost_recvs=spec.prepost_recvs, fault=spec.fault,
        aborted=abort_event.is_set,
        on_chunk_done=(lambda done, known: result_queue.put(("progress", run_id, rank, done, known)))
        if holds_last else None,
    )
    executor.run()
    report = RankReport(
        rank=rank, pid=os.getpid(), records=executor.records, executed=[str(a) for a in feed.executed],
        lengths=list(feed.lengths), arrivals_s=list(feed.arrivals_s), ready_s=ready_s,
        finished_s=executor.finished_s, drained_s=executor.drained_s,
        peak_kv_bytes=executor.kv.peak_bytes, num_parameters=model.num_parameters,
    )
    if rank == 0:
        report.chunks = [(c.request_index, c.chunk_index, c.start, c.num_tokens, c.is_last, c.batch)
                         for c in planner.sequence]
    if holds_last and spec.collect_outputs:
        path = pool_dir / f"outputs-run{run_id}-rank{rank}.pt"
        torch.save(executor.final_outputs(), path)
        report.outputs_path = str(path)
    result_queue.put(("report", run_id, rank, report))


def _start_failure(error: RuntimeError, rank: int, timeout_s: float) -> BaseException:
    """A gloo failure of the start-of-run barrier as a comm error of this rank: a peer that left
    (it failed building its share of the model) is then the launcher's consequence, not the cause."""
    from ..comm.gloo import classify_gloo_error

    failure = classify_gloo_error(error, timeout_s)
    located = failure.with_action("the start-of-run barrier", rank=rank)
    located.__cause__ = error
    return located


class _Tagged:
    """A control queue seen by the coordinator: every op is sent with the run id."""

    def __init__(self, queue: Any, run_id: int) -> None:
        self._queue, self._run_id = queue, run_id

    def put(self, op: Any) -> None:
        self._queue.put((self._run_id, op))


class _Untagged:
    """A control queue seen by a follower: ops of other (earlier, failed) runs are dropped."""

    def __init__(self, queue: Any, run_id: int) -> None:
        self._queue, self._run_id = queue, run_id

    def get(self, timeout: float) -> Any:
        import queue as queue_module

        deadline = time.monotonic() + timeout
        while True:
            run_id, op = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            if run_id == self._run_id:
                return op
            if time.monotonic() >= deadline:
                raise queue_module.Empty


def _device(device: Any, rank: int) -> Any:
    import torch

    from .reference import prepare_device
    from .spec import Device

    prepare_device(device.value)
    if device is Device.CUDA:
        count = max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(rank % count)
        return torch.device("cuda", rank % count)
    torch.npu.set_device(rank)  # type: ignore[attr-defined]
    return torch.device("npu", rank)
