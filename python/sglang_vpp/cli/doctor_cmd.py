"""``sglang-vpp doctor``: which communication backends and devices are usable here, and a 2-rank self-test.

Data flow: ``registry.probe_backends()`` (no process group, lazy device imports) -> table of
backend, availability, distribution and version, runtime versions, devices, and why a backend is
unavailable with the fix -> ``launcher.run_ranks(scenarios.selftest, 2, backend)``: two local rank
processes build a communicator (two groups per direction, warm-up, distinct-communicator check),
exchange in both directions at once, check the data bit for bit and time small round trips.
Exit code: 0 when the self-test passed (or was skipped with ``--no-self-test``), 1 when it failed or
the backend is unavailable, 2 for a bad option.
"""

from __future__ import annotations

import json
import platform
import sys

import typer

from .common import echo_wrapped, positive, user_errors


def _rows(statuses: list) -> list[dict]:
    return [{
        "backend": s.name,
        "available": s.available,
        "distribution": s.distribution or "-",
        "version": s.version or "not installed",
        "runs_on": ", ".join(f"{k} {v}" for k, v in s.versions.items()) or "-",
        "devices": ", ".join(s.devices) or "-",
        "why_not": "" if s.available else f"{s.reason}. Fix: {s.fix}" if s.fix else s.reason,
    } for s in statuses]


def _print_table(rows: list[dict]) -> None:
    """The backends table, then why each unavailable one is, as wrapped text: 80 columns in all."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sglang-vpp communication backends", box=box.SIMPLE_HEAD)
    for column in ("backend", "available", "distribution", "version", "runs on", "devices"):
        table.add_column(column, overflow="fold", no_wrap=column in ("backend", "available", "distribution"))
    for row in rows:
        table.add_row(row["backend"], "yes" if row["available"] else "no", row["distribution"], row["version"],
                      row["runs_on"], row["devices"])
    Console(width=80).print(table)
    for row in rows:
        if row["why_not"]:
            echo_wrapped(f"{row['backend']}: {row['why_not']}")



@user_errors
def doctor(
    backend: str = typer.Option("gloo", "--backend",
                                help="Backend of the 2-rank self-test: gloo, nccl, hccl, or nccl@double / "
                                     "hccl@double (their code on the gloo device double)."),
    self_test: bool = typer.Option(True, "--self-test/--no-self-test", help="Run the 2-rank self-test."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds allowed for the whole self-test."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List communication backends and devices (versions, why unavailable), then self-test one."""
    positive(timeout, "--timeout")
    import torch

    from ..comm.launcher import run_ranks
    from ..comm.registry import parse_backend_spec, probe_backend, probe_backends

    name, is_double = parse_backend_spec(backend)  # an unknown name is a user error (exit 2)
    rows = _rows(probe_backends())
    report: dict = {
        "platform": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "cuda": str(torch.version.cuda), "machine": platform.machine()},
        "backends": rows, "self_test": None,
    }
    if not as_json:
        typer.echo(f"python {report['platform']['python']}, torch {torch.__version__}, "
                   f"torch CUDA {torch.version.cuda}, {platform.machine()}")
        _print_table(rows)
    exit_code = 0
    if self_test:
        status = probe_backend(name)
        if not is_double and not status.available:
            report["self_test"] = {"backend": backend, "passed": False, "reason": status.reason, "fix": status.fix}
            exit_code = 1
        else:
            result = run_ranks("sglang_vpp.comm.testing.scenarios:selftest", 2, args=(backend,), timeout_s=timeout)
            passed = result.ok and all(o.value["data_ok"] for o in result.outcomes)
            report["self_test"] = {
                "backend": backend, "passed": passed, "elapsed_s": round(result.elapsed_s, 2),
                "ranks": [o.value if o.ok else {"error": o.error_type, "detail": o.traceback.strip().splitlines()[-1:]}
                          for o in result.outcomes],
            }
            exit_code = 0 if passed else 1
        if not as_json:
            _print_self_test(report["self_test"])
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    raise typer.Exit(exit_code)


def _print_self_test(test: dict) -> None:
    backend = test["backend"]
    if "ranks" not in test:
        echo_wrapped(f"self-test ({backend}, 2 ranks): FAIL: backend unavailable: {test['reason']}. Fix: {test['fix']}")
        return
    verdict = "PASS" if test["passed"] else "FAIL"
    typer.echo(f"self-test ({backend}, 2 ranks): {verdict} in {test['elapsed_s']:.1f}s")
    for rank, value in enumerate(test["ranks"]):
        if "error" in value:
            echo_wrapped(f"rank {rank}: {value['error']}: {' '.join(value['detail'])}", "  ")
            continue
        comms = ", ".join(f"{k} = {v}" for k, v in value["communicators"].items())
        echo_wrapped(f"rank {rank}: distinct communicators [{comms}]; both directions at once, data exact: "
                      f"{'yes' if value['data_ok'] else 'NO'}; round trip {value['round_trip_us']:.0f} us", "  ")
