"""``sglang-vpp check``: validate a plan and dry-run it for deadlocks; exit 1 if either fails."""

from __future__ import annotations

from typing import Optional

import typer

from .common import emit_json, user_errors
from .schedule_cmd import plan_from_options


@user_errors
def check(
    mode: str = typer.Option(..., "--mode", help="cpp, dcpp, vpp, vpp-async or vpp-pack."),
    pp: int = typer.Option(..., "--pp", help="Number of pipeline ranks P."),
    seq_len: str = typer.Option(..., "--seq-len", help="Prompt length per request (16k, 1m, ...)."),
    chunk_size: str = typer.Option(..., "--chunk-size", help="Chunk size (base size for dcpp)."),
    requests: int = typer.Option(1, "--requests", help="Number of requests of --seq-len tokens."),
    groups: Optional[int] = typer.Option(None, "--groups", help="Override the mode's group count (1 or 2); 1 with vpp-async is the deadlock negative control."),
    layers: int = typer.Option(48, "--layers", help="Decoder layers to split among stages."),
    split: Optional[str] = typer.Option(None, "--split", help="Per-stage layer counts."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check that every action's inputs exist, sends pair with receives, and nothing deadlocks
    under rendezvous semantics (a send waits for its receive; one in-order queue per group)."""
    from ..schedule import check_deadlock, find_issues

    plan = plan_from_options(mode, pp, seq_len, chunk_size, requests, layers, None if split is None else split, groups)
    issues = find_issues(plan)
    report = check_deadlock(plan)
    ok = not issues and not report.deadlock
    if as_json:
        emit_json({
            "valid": not issues,
            "deadlock": report.deadlock,
            "cycle": report.cycle,
            "blocked": report.blocked,
            "issues": [issue.to_dict() for issue in issues],
            "actions": plan.num_actions,
        })
    else:
        typer.echo(f"{plan.policy} pp={pp} groups={','.join(plan.groups) or '-'} {plan.comm_semantics} sends, "
                   f"{plan.num_actions} actions")
        typer.echo("valid" if not issues else f"INVALID: {len(issues)} problems")
        for issue in issues[:10]:
            typer.echo(f"  rank {issue.rank} step {issue.step}: {issue.message}")
        typer.echo(report.describe(plan.rank_actions))
    raise typer.Exit(0 if ok else 1)
