"""``sglang-vpp check``: validate a plan and dry-run it for deadlocks; exit 1 if either fails.

With ``--trace DIR`` instead: replay a VPP server's recorded decisions (``--vpp-trace DIR``)
through the schedule core's controller; exit 0 when the server followed it, 1 at the first
divergence, 2 for input that cannot be read. With ``--reproduce`` too: then predict the server
from its measured timings (``serving/reproduce.py``) and compare every rank's computes and
decisions record by record; exit 1 at the first difference.
"""

from __future__ import annotations

from typing import Optional

import typer

from .common import FOLD_HELP, emit_json, given_flags, not_blank, user_errors
from .schedule_cmd import plan_from_options

# The flags that describe a plan to check; a trace holds the server's own plan.
_PLAN_FLAGS = {"mode": "--mode", "pp": "--pp", "seq_len": "--seq-len", "chunk_size": "--chunk-size",
               "requests": "--requests", "groups": "--groups", "layers": "--layers", "split": "--split", "fold": "--fold"}


@user_errors
def check(
    ctx: typer.Context,
    mode: Optional[str] = typer.Option(None, "--mode", help="cpp, dcpp, vpp, vpp-async, vpp-pack, vpp-taper or vpp-stream (required without --trace)."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Number of pipeline ranks P (required without --trace)."),
    seq_len: Optional[str] = typer.Option(None, "--seq-len", help="Prompt length per request (16k, 1m, ...; required without --trace)."),
    chunk_size: Optional[str] = typer.Option(None, "--chunk-size", help="Chunk size (base size for dcpp; required without --trace)."),
    requests: int = typer.Option(1, "--requests", help="Number of requests of --seq-len tokens."),
    groups: Optional[int] = typer.Option(None, "--groups", help="Override the mode's group count (1 or 2); 1 with vpp-async is the deadlock negative control."),
    layers: int = typer.Option(48, "--layers", help="Decoder layers to split among stages."),
    split: Optional[str] = typer.Option(None, "--split", help="Per-stage layer counts."),
    fold: str = typer.Option("split", "--fold", help=FOLD_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Replay the decisions of a VPP server's --vpp-trace DIR through the controller instead."),
    reproduce: bool = typer.Option(False, "--reproduce", help="With --trace: also predict the server from its measured timings and compare every rank's records."),
) -> None:
    """Check that every action's inputs exist, sends pair with receives, and nothing deadlocks
    under rendezvous semantics (a send waits for its receive; one in-order queue per group).
    With --trace DIR: check that a VPP server decided as the schedule core's controller does."""
    if reproduce and trace is None:
        raise ValueError("--reproduce needs --trace DIR, the directory a VPP server wrote with --vpp-trace")
    not_blank(trace, "--trace", "give the directory a VPP server wrote with --vpp-trace")
    if trace is not None:
        plan_flags = given_flags(ctx, _PLAN_FLAGS)
        if plan_flags:
            raise ValueError(f"--trace replays the server's own plan; drop {', '.join(plan_flags)} "
                             "(they describe a plan to check without --trace)")
        _check_trace(trace, as_json, reproduce)
    missing = [flag for flag, value in (("--mode", mode), ("--pp", pp), ("--seq-len", seq_len),
                                        ("--chunk-size", chunk_size)) if value is None]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}; give --mode, --pp, --seq-len and --chunk-size, "
                         "or --trace DIR to replay a server's decisions")
    if groups is not None and groups not in (1, 2):
        raise ValueError(f"--groups must be 1 or 2, got {groups}")
    from ..schedule import check_deadlock, find_issues

    plan = plan_from_options(mode, pp, seq_len, chunk_size, requests, layers, None if split is None else split, groups,
                             fold=fold)
    issues = find_issues(plan)
    report = check_deadlock(plan)
    ok = not issues and not report.deadlock
    if as_json:
        emit_json({
            "mode": str(plan.policy),
            "pp": pp,
            "fold": str(plan.layout.fold),
            "groups": list(plan.groups),
            "semantics": str(plan.comm_semantics),
            "valid": not issues,
            "deadlock": report.deadlock,
            "cycle": report.cycle,
            "blocked": report.blocked,
            "issues": [issue.to_dict() for issue in issues],
            "actions": plan.num_actions,
        })
    else:
        # The fused fold changes the stages checked (2P-1), so the header says so, as simulate's title does.
        fused = " (fused fold)" if str(plan.layout.fold) == "fused" else ""
        typer.echo(f"{plan.policy} pp={pp}{fused} groups={','.join(plan.groups) or '-'} {plan.comm_semantics} "
                   f"sends, {plan.num_actions} actions")
        typer.echo("valid" if not issues else f"INVALID: {len(issues)} problems")
        for issue in issues[:10]:
            typer.echo(f"  rank {issue.rank} step {issue.step}: {issue.message}")
        typer.echo(report.describe(plan.rank_actions))
    raise typer.Exit(0 if ok else 1)


def _check_trace(trace: str, as_json: bool, reproduce: bool) -> None:
    from ..serving.decision_replay import replay_trace
    from ..serving.reproduce import reproduce_trace

    result = replay_trace(trace)
    divergence = result.divergence
    predicted = reproduce_trace(trace) if reproduce and divergence is None else None
    difference = None if predicted is None else predicted.difference
    if as_json:
        emit_json({
            "mode": result.mode, "ranks": result.num_ranks, "decisions": result.num_decisions,
            "admitted": result.num_admitted, "packed": result.num_packed, "ok": result.ok,
            "divergence": None if divergence is None else {
                "rank": divergence.rank, "index": divergence.index, "micro_batch": divergence.seq,
                "expected": divergence.expected, "observed": divergence.observed,
            },
            **({} if predicted is None else {"reproduce": {
                "ok": predicted.ok, "compared": {str(rank): n for rank, n in predicted.compared.items()},
                "difference": None if difference is None else {
                    "rank": difference.rank, "stream": difference.stream, "index": difference.index,
                    "expected": difference.expected, "observed": difference.observed,
                },
            }}),
        })
    else:
        typer.echo(f"{result.mode} trace: {result.num_ranks} ranks, {result.num_decisions} decisions, "
                   f"{result.num_admitted} micro-batches admitted ({result.num_packed} packed)")
        typer.echo("the server followed the controller" if divergence is None
                   else f"DIVERGENCE at {divergence.describe()}")
        if predicted is not None and difference is not None:
            typer.echo(f"REPRODUCE DIFFERENCE at rank {difference.rank}, {difference.stream} record "
                       f"{difference.index}:")
            typer.echo(f"  engine expected {difference.expected}")
            typer.echo(f"  server recorded {difference.observed}")
        elif predicted is not None:
            counts = ", ".join(f"{n}" for _, n in sorted(predicted.compared.items()))
            typer.echo(f"reproduced record by record: {counts} records on ranks 0..{len(predicted.compared) - 1}")
    raise typer.Exit(0 if divergence is None and difference is None else 1)
