"""``sglang-vpp schedule``: print the per-rank action streams of a plan."""

from __future__ import annotations

from typing import Optional

import typer

from .common import FOLD_HELP, CliInputError, emit_json, layers_option, parse_fold_option, parse_int_list, parse_size_option, user_errors


def plan_from_options(mode: str, pp: int, seq_len: str, chunk_size: str, requests: int,
                      layers: int, split: Optional[str], groups: Optional[int] = None, cost=None,
                      fold: str = "split"):
    """Build the schedule the schedule/check commands print (shared by both). ``cost``: the
    controller's estimate (None: the schedule core's default), for tests that compare commands
    on one cost model. ``fold``: a vpp mode's fold (``--fold``)."""
    from ..schedule import (RequestSpec, build_schedule, check_chunk_counts, check_num_ranks, check_num_requests,
                            check_request_count, plan_stages)
    from ..schedule.auto_size import is_auto

    if is_auto(chunk_size):  # auto sizes each chunk as the run goes, against the cost model's clock
        raise CliInputError("--chunk-size auto is chosen while a run goes (simulate, bench); this command "
                            "prints one plan of fixed chunks: give a size, e.g. 1k")
    check_num_ranks(pp)
    check_num_requests(requests, "--requests")
    layers_option(layers)
    length = parse_size_option(seq_len, "--seq-len")
    size = parse_size_option(chunk_size, "--chunk-size")
    fold = parse_fold_option(fold)
    stages = plan_stages([mode], pp, fold)
    check_request_count(requests, stages, pp, "--requests")
    check_chunk_counts([length] * requests, size, stages, pp, "--chunk-size", "a --seq-len request",
                       "the --requests x --seq-len load")
    return build_schedule(
        mode, pp, layers, [RequestSpec(length) for _ in range(requests)], size,
        split=parse_int_list(split, "--split"), cost=cost, num_groups=groups, fold=fold,
    )


@user_errors
def schedule(
    mode: str = typer.Option(..., "--mode", help="cpp, dcpp, vpp, vpp-async, vpp-pack, vpp-taper or vpp-stream."),
    pp: int = typer.Option(..., "--pp", help="Number of pipeline ranks P."),
    seq_len: str = typer.Option(..., "--seq-len", help="Prompt length per request (16k, 1m, ...)."),
    chunk_size: str = typer.Option(..., "--chunk-size", help="Chunk size (base size for dcpp)."),
    requests: int = typer.Option(1, "--requests", help="Number of requests of --seq-len tokens, queued in order."),
    layers: int = typer.Option(48, "--layers", help="Decoder layers to split among stages."),
    split: Optional[str] = typer.Option(None, "--split", help="Per-stage layer counts."),
    fold: str = typer.Option("split", "--fold", help=FOLD_HELP),
    fmt: str = typer.Option("text", "--format", help="text or json."),
) -> None:
    """Print each rank's ordered actions (text: 3F1.0 = stage 3 computes request 1 chunk 0)."""
    from ..schedule import schedule_to_json, schedule_to_text

    if fmt not in ("text", "json"):
        raise ValueError(f"--format must be text or json, got {fmt!r}")
    plan = plan_from_options(mode, pp, seq_len, chunk_size, requests, layers, split, fold=fold)
    if fmt == "json":
        emit_json(schedule_to_json(plan))
    else:
        typer.echo(schedule_to_text(plan))
