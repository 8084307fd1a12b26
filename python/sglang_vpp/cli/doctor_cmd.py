"""``sglang-vpp doctor``: which communication backends and devices are usable here, and a 2-rank self-test.

Data flow: ``registry.probe_backends()`` (no process group, lazy device imports) -> table of
backend, availability, distribution and version, runtime versions, devices, and why a backend is
unavailable with the fix -> ``launcher.run_ranks(scenarios.selftest, 2, backend)``: two local rank
processes build a communicator (two groups per direction, warm-up, distinct-communicator check),
exchange in both directions at once, check the data bit for bit and time small round trips.
Exit code: 0 when the self-test passed (or was skipped with ``--no-self-test``), 1 when it failed or
the backend is unavailable, 2 for a bad option.

``--sglang`` instead prints the SGLang surface the plugin declares (``sglang_plugin/surface.py``)
with each name's status on the installed SGLang; exit 1 when a name is missing or changed.
"""

from __future__ import annotations

import json
import platform
import sys

import typer

from .common import echo_wrapped, given_flags, timeout_option, user_errors


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
    ctx: typer.Context,
    backend: str = typer.Option("gloo", "--backend",
                                help="Backend of the 2-rank self-test: gloo, nccl, hccl, or nccl@double / "
                                     "hccl@double (their code on the gloo device double)."),
    self_test: bool = typer.Option(True, "--self-test/--no-self-test", help="Run the 2-rank self-test."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds allowed for the whole self-test."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    sglang: bool = typer.Option(False, "--sglang", help="Print every SGLang name the plugin declares "
                                "(surface.py) with its status on the installed SGLang, instead."),
) -> None:
    """List communication backends and devices (versions, why unavailable), then self-test one."""
    if sglang:
        # The self-test's flags would be ignored: the run would not be the one asked for.
        ignored = given_flags(ctx, {"backend": "--backend", "self_test": "--self-test" if self_test else "--no-self-test",
                                    "timeout": "--timeout"})
        if ignored:
            raise ValueError(f"--sglang lists the SGLang surface and runs no self-test; drop {', '.join(ignored)}")
        raise typer.Exit(_sglang_surface(as_json))
    timeout_option(timeout, "--timeout")
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


def _sglang_surface(as_json: bool) -> int:
    """Print the declared SGLang surface, one name a row grouped by module; 1 if one fails."""
    from ..sglang_plugin.surface import SURFACE, problem_of
    from ..sglang_plugin.version import SUPPORTED_SGLANG_VERSION

    try:
        from sglang.version import __version__ as installed
    except ImportError:
        installed = None
    rows = [{"name": n.path, "use": str(n.use), "scope": str(n.scope), "params": list(n.params),
             "problem": problem_of(n) if installed else "sglang is not installed"} for n in SURFACE]
    failed = sum(row["problem"] is not None for row in rows)
    if as_json:
        typer.echo(json.dumps({"sglang": installed, "declared_for": SUPPORTED_SGLANG_VERSION, "names": rows},
                              indent=2))
        return 1 if failed else 0
    typer.echo(f"SGLang names sglang-vpp relies on: {len(rows)}, {failed} not ok")
    typer.echo(f"(declared for SGLang {SUPPORTED_SGLANG_VERSION}, installed: {installed or 'none'})")
    for row in rows:
        status = "ok" if row["problem"] is None else "FAIL"
        head = f"{status:<4} {row['use']:<10} {row['scope']:<14} "
        name = row["name"]
        if len(head) + len(name) <= 80:
            typer.echo(head + name)
        else:
            typer.echo(head.rstrip())
            for line in _dotted_lines(name, 76):
                typer.echo("    " + line)
        if row["problem"] is not None:
            echo_wrapped(row["problem"], "    ")
    return 1 if failed else 0


def _dotted_lines(name: str, width: int) -> list[str]:
    """A dotted path cut after dots into lines of at most ``width`` (a part longer stays whole)."""
    lines = [""]
    for part in name.split("."):
        piece = part if not lines[-1] else "." + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines[-1] += "."
            lines.append(part)
        else:
            lines[-1] += piece
    return lines
