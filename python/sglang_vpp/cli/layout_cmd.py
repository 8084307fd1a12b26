"""``sglang-vpp layout``: which layers each stage holds and which rank runs it."""

from __future__ import annotations

from typing import Optional

import typer

from .common import LAYOUT_FOLD_HELP, emit_json, layers_option, parse_fold_option, parse_int_list, user_errors


@user_errors
def layout(
    pp: int = typer.Option(..., "--pp", help="Number of pipeline ranks P."),
    layers: int = typer.Option(..., "--layers", help="Number of decoder layers L."),
    mode: str = typer.Option("vpp", "--mode", help="cpp (contiguous, P stages) or vpp (fold-back, 2P stages); any mode name works."),
    split: Optional[str] = typer.Option(None, "--split", help="Per-stage layer counts, e.g. 3,3,3,3."),
    fold: str = typer.Option("split", "--fold", help=LAYOUT_FOLD_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Print the stage -> rank -> layers layout (layers as half-open ranges)."""
    from ..schedule import build_layout, check_num_ranks

    check_num_ranks(pp)
    layers_option(layers)
    result = build_layout(pp, layers, mode, parse_int_list(split, "--split"), parse_fold_option(fold))
    if as_json:
        emit_json(result.to_dict())
        return
    fused = ", fused fold" if str(result.fold) == "fused" else ""
    typer.echo(f"{result.kind} layout{fused}: {result.num_ranks} ranks, {result.num_layers} layers, "
               f"{result.num_stages} stages")
    typer.echo(f"{'stage':>5} {'rank':>4}  layers")
    for stage in result.stages:
        typer.echo(f"{stage.stage_index:>5} {stage.rank:>4}  [{stage.layer_start}, {stage.layer_end})  ({stage.num_layers})")
