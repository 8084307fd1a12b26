"""``sglang-vpp doctor``: the backend table, reasons, and the 2-rank self-test."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from comm_support import device_reason
from sglang_vpp.cli.app import app

runner = CliRunner()


def test_doctor_gloo_prints_the_table_and_passes_the_self_test() -> None:
    result = runner.invoke(app, ["doctor", "--backend", "gloo"])
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())  # long lines wrap at 80 columns
    for text in ("gloo", "nccl", "hccl", "self-test (gloo, 2 ranks): PASS", "distinct communicators",
                 "fwd<->1", "bwd<->1", "data exact: yes"):
        assert text in words, text
    for name in ("nccl", "hccl"):  # each unavailable backend: why, under the table
        reason = device_reason(name)
        assert reason is None or f"\n{name}: " in result.output, name
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_doctor_json_lists_every_backend_with_a_reason() -> None:
    result = runner.invoke(app, ["doctor", "--json", "--no-self-test"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    rows = {row["backend"]: row for row in report["backends"]}
    assert set(rows) >= {"gloo", "nccl", "hccl"} and rows["gloo"]["available"]
    assert all(row["available"] or row["why_not"] for row in rows.values())
    assert report["self_test"] is None and report["platform"]["torch"]


def test_doctor_on_an_unavailable_device_backend_fails_with_the_reason() -> None:
    reason = device_reason("nccl")
    if reason is None:
        pytest.skip("nccl is available here: the failure path cannot be shown")
    result = runner.invoke(app, ["doctor", "--backend", "nccl"])
    assert result.exit_code == 1
    assert "self-test (nccl, 2 ranks): FAIL: backend unavailable" in result.output


def test_doctor_rejects_an_unknown_backend() -> None:
    result = runner.invoke(app, ["doctor", "--backend", "mpi", "--no-self-test"])
    assert result.exit_code == 2 and "unknown communication backend 'mpi'" in result.output


def test_doctor_runs_the_hccl_backend_on_the_device_double() -> None:
    result = runner.invoke(app, ["doctor", "--backend", "hccl@double"])
    assert result.exit_code == 0, result.output
    assert "vpp_fwd_0_1" in result.output and "vpp_bwd_0_1" in result.output and "PASS" in result.output
