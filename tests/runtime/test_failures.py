"""User errors and crashed ranks: a clear error, a non-zero exit, no hang, no stray processes."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import psutil
import pytest
from sglang_vpp.runtime.errors import ModelPathError, RankFailedError, RunConfigError
from sglang_vpp.runtime.launcher import check_spec, launch
from sglang_vpp.runtime.models import full_model, resolve_model, save_checkpoint
from sglang_vpp.runtime.spec import (
    FaultKind,
    FaultSpec,
    RequestArrival,
    RunSpec,
    Timeouts,
)

FAST = Timeouts(comm_s=4.0, control_s=8.0, startup_s=180.0, run_s=120.0, grace_s=3.0)


def _spec(**kw) -> RunSpec:
    base = dict(model="tiny-qwen3", mode="vpp-async", num_ranks=2, requests=(RequestArrival(256),),
                chunk_size=32, timeouts=FAST)
    base.update(kw)
    return RunSpec(**base)


def _descendants(parent: psutil.Process) -> set[int]:
    """The pids below ``parent`` now; none once it is gone. A process that exits while psutil
    walks the tree (a short-lived helper of the launcher) is a race of the scan, not a stray."""
    try:
        return {child.pid for child in parent.children(recursive=True)}
    except (psutil.Error, ValueError):
        return set()


def _all_dead(pids: list[int], grace_s: float = 5.0) -> bool:
    """Every one of ``pids`` gone (or a zombie) within ``grace_s``: a rank the launcher has
    signalled may still be in its exit when the launcher itself returns, and multiprocessing's
    resource tracker (a descendant too) exits only once the launcher has; a stray stays."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() >= deadline:
            return not alive
        time.sleep(0.1)


# ----------------------------------------------------------------------------- user errors (fast)
def test_unknown_mode_lists_valid_modes():
    with pytest.raises(RunConfigError, match="unknown mode 'zigzag'; valid modes: cpp, dcpp, vpp, vpp-async, vpp-pack"):
        launch(_spec(mode="zigzag"))


def test_more_stages_than_layers():
    with pytest.raises(RunConfigError, match="3 layers cannot fill 4 stages"):
        check_spec(_spec(mode="vpp", num_layers=3))
    check_spec(_spec(mode="cpp", num_layers=3))  # 2 contiguous stages fit


def test_bad_model_path(tmp_path):
    with pytest.raises(ModelPathError, match="not a directory"):
        launch(_spec(model=str(tmp_path / "nope")))


def test_pp_one_is_refused():
    with pytest.raises(RunConfigError, match="--pp must be >= 2"):
        check_spec(_spec(num_ranks=1))


def test_the_head_names_the_rank_that_failed_not_the_one_the_launcher_stopped_for_it():
    """``bench --timeout 0.0001``: rank 1's receive timed out, and the launcher then stopped rank 0
    (RunAborted, "see that rank's error"); the first line named rank 0 and its RunAborted."""
    from sglang_vpp.runtime.launcher import _Monitor

    monitor = _Monitor(_spec(), 0, [], None, None, None, set())
    monitor.errors = {0: "RunAborted: rank 0: stopped by the launcher after 2 actions because another rank failed",
                      1: "CommTimeoutError: rank 1, action 0RECV_F0.0<0@pp: timed out after 0.00s"}
    monitor.first_failure = (0, monitor.errors[0])
    assert monitor._root_cause() == (1, monitor.errors[1])


# ----------------------------------------------------------------------------- crashed ranks (processes)
def test_a_rank_failing_before_the_start_barrier_is_named_not_the_peer_it_left_there(tmp_path):
    """A checkpoint without rank 1's layers fails rank 1 while it builds its share; rank 0, at the
    start-of-run barrier, sees only that its peer left. The error names rank 1 and its cause."""
    from safetensors.torch import load_file, save_file

    save_checkpoint(full_model(resolve_model("tiny-qwen3")), tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("model.layers.7.")},
              str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RankFailedError) as caught:
        # A long grace: rank 0 reports its own error even on a loaded host (it ends the wait at once).
        launch(_spec(model=str(tmp_path), mode="cpp", requests=(RequestArrival(64),),
                     timeouts=dataclasses.replace(FAST, grace_s=60.0)))
    head = str(caught.value).splitlines()[0]
    assert "rank 1 failed: ModelPathError" in head and "model.layers.7." in head, head
    assert "PeerDeadError" in caught.value.rank_errors[0], caught.value.rank_errors[0]


@pytest.mark.slow
def test_killed_rank_stops_the_run():
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        launch(_spec(fault=FaultSpec(rank=1, after_actions=5, kind=FaultKind.KILL)))
    elapsed = time.monotonic() - started
    text = str(caught.value)
    assert "rank 1 failed: process died (killed by SIGKILL)" in text
    assert "rank 0 (pid" in text and "all rank processes were stopped and joined" in text
    assert set(caught.value.rank_errors) == {0, 1}  # the survivor reported its own error too
    pids = [int(line.split("pid ")[1].split(")")[0]) for line in text.splitlines() if "(pid " in line]
    assert len(pids) == 2 and _all_dead(pids)
    assert elapsed < FAST.startup_s + 30


@pytest.mark.slow
def test_hung_rank_times_out():
    """A rank that stops making progress: its peer's bounded wait fires, the launcher kills it."""
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        launch(_spec(mode="vpp", fault=FaultSpec(rank=1, after_actions=3, kind=FaultKind.HANG)))
    text = str(caught.value)
    # Rank 0 is caught in whichever bounded wait it is in when rank 1 stops: waiting for rank 1's
    # completion reports (the planner decides on them) or in a blocking send to rank 1.
    waiting_for_reports = "rank 0 failed: TimeoutError" in text and "no completion report for 8s" in text
    sending = "rank 0 failed: CommTimeoutError" in text and "never paired" in text
    assert waiting_for_reports or sending, text
    assert "rank 1 (pid" in text and "no report; stopped by the launcher" in text
    assert time.monotonic() - started < FAST.startup_s + 40


# ----------------------------------------------------------------------------- the CLI
def _cli(*args: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def test_cli_user_errors(tmp_path):
    bad_path = _cli("--model", str(tmp_path / "missing"))
    assert bad_path.returncode == 2 and "error: --model" in bad_path.stderr and "not a directory" in bad_path.stderr
    bad_mode = _cli("--modes", "cpp,zigzag")
    assert bad_mode.returncode == 2 and "unknown mode 'zigzag'" in bad_mode.stderr
    save_checkpoint(full_model(resolve_model("tiny-qwen3", num_layers=3)), tmp_path / "three")
    too_deep = _cli("--model", str(tmp_path / "three"), "--modes", "vpp")
    assert too_deep.returncode == 2 and "3 layers cannot fill 4 stages" in too_deep.stderr
    bad_device = _cli("--device", "tpu")
    assert bad_device.returncode == 2 and "--device must be cpu, cuda or npu" in bad_device.stderr


@pytest.mark.slow
def test_cli_killed_rank_exits_nonzero_without_strays():
    env = {"SGLANG_VPP_FAULT": "rank=0,after=6,kind=kill"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--quiet", "--seq-len", "512", "--chunk-size", "32",
         "--requests", "1", "--modes", "vpp-pack", "--timeout", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    seen: set[int] = set()
    parent = psutil.Process(process.pid)
    while process.poll() is None:
        seen |= _descendants(parent)
        time.sleep(0.2)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 1, (out, err)
    assert "error: pipelined run failed (mode vpp-pack, pp 2" in err
    assert "rank 0 failed: process died (killed by SIGKILL)" in err
    assert seen and _all_dead(sorted(seen))


def test_a_rank_whose_launcher_died_before_it_started_exits_at_once(tmp_path):
    """A launcher killed (``timeout``'s SIGTERM) while its ranks still imported left them orphaned
    before they asked to die with it: they waited for the rendezvous, then for jobs, forever.
    Here the rank is told its launcher is a process that is not its parent."""
    import multiprocessing as mp

    from sglang_vpp.runtime.launcher import PoolSpec
    from sglang_vpp.runtime.rank_main import rank_main

    ctx = mp.get_context("spawn")
    queue, event = ctx.Queue(), ctx.Event()
    gone = 1 if os.getpid() != 1 else 2  # a pid that is not the rank's parent
    process = ctx.Process(target=rank_main, daemon=True,
                          args=(0, PoolSpec(2, timeouts=FAST), str(tmp_path), queue, [queue, queue], queue, event,
                                gone))
    process.start()
    process.join(timeout=120)  # spawn's imports take seconds; the rendezvous alone would wait startup_s (180 s)
    alive = process.is_alive()
    if alive:
        process.kill()
    assert not alive and process.exitcode == 1
    assert not (tmp_path / "rendezvous").exists()


def test_cli_bench_stopped_by_sigterm_leaves_no_rank_and_no_pool_directory(tmp_path):
    """``timeout``'s SIGTERM ended the launcher without unwinding: the rank pool's directory
    (rendezvous file, every run's outputs) stayed in /tmp."""
    import signal

    process = subprocess.Popen(
        [sys.executable, "-m", "sglang_vpp.cli.app", "bench", "--quiet", "--seq-len", "4k", "--chunk-size", "32",
         "--requests", "2", "--modes", "cpp,vpp", "--repeat", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    parent = psutil.Process(process.pid)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("sglang-vpp-*/outputs-*")) and process.poll() is None:  # a run is under way
        seen |= _descendants(parent)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    seen |= _descendants(parent)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, (out, err)
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 10  # a rank killed as its launcher exits may take a moment to go
    while not _all_dead(sorted(seen)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert seen and _all_dead(sorted(seen))
    assert not list(tmp_path.glob("sglang-vpp-*")), list(tmp_path.iterdir())
