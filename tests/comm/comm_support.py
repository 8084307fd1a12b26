"""Helpers shared by the comm tests: backend parameters with skip reasons, and a launcher wrapper.

Backend parameters: ``gloo`` and the two device doubles always run here; the real ``nccl`` and
``hccl`` run where ``probe()`` says the device exists and are otherwise skipped with the probe's
reason, never silently. The sibling distributions in ``backends/`` are put on ``sys.path`` (here and
in the rank processes) when they are not installed, so their code is always under test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS_COMM = Path(__file__).resolve().parent
BACKEND_DIRS = [str(REPO / "backends" / "cuda"), str(REPO / "backends" / "ascend")]
RANK_SYS_PATH = [str(TESTS_COMM), str(REPO / "tests" / "device"), *BACKEND_DIRS]
for _entry in BACKEND_DIRS:
    if _entry not in sys.path:
        sys.path.append(_entry)  # after site-packages: an installed copy wins

from sglang_vpp.comm.launcher import LaunchResult, run_ranks  # noqa: E402
from sglang_vpp.comm.registry import probe_backend  # noqa: E402

RUNNERS = {"nccl": "backends/cuda/run_conformance.sh", "hccl": "backends/ascend/run_conformance.sh"}


def device_reason(name: str, min_devices: int = 2) -> str | None:
    """Why the real ``name`` backend cannot run the suite here (None if it can)."""
    status = probe_backend(name)
    if not status.available:
        return (f"{name}: {status.reason}. Fix: {status.fix}. On hardware run {RUNNERS[name]}")
    if len(status.devices) < min_devices:
        return f"{name}: needs {min_devices} devices (one rank per device), found {len(status.devices)}"
    return None


def backend_params(min_devices: int = 2) -> list[Any]:
    """gloo, the two doubles, and the real device backends (skipped with the reason)."""
    params = [pytest.param("gloo", id="gloo"),
              pytest.param("nccl@double", id="nccl-double"),
              pytest.param("hccl@double", id="hccl-double")]
    for name in ("nccl", "hccl"):
        reason = device_reason(name, min_devices)
        marks = [pytest.mark.device]
        if reason:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def launch(target: str, world_size: int, *args: Any, launch_timeout_s: float = 90.0,
           env: dict[str, str] | None = None, **kwargs: Any) -> LaunchResult:
    """Run ``target`` ("module:function", or a scenario name) on ``world_size`` local ranks.

    ``launch_timeout_s`` bounds the whole run (the launcher kills every rank after it); keyword
    arguments go to the rank program. Asserts that no rank process outlived the call."""
    if ":" not in target:
        target = f"sglang_vpp.comm.testing.scenarios:{target}"
    result = run_ranks(target, world_size, args=args, kwargs=kwargs, timeout_s=launch_timeout_s, env=env,
                       sys_path=RANK_SYS_PATH)
    assert_no_orphans(result.pids)
    return result


def assert_no_orphans(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"rank process {pid} is still alive after the launcher returned")
