"""Benchmark results as JSON lines, each tagged with the server configuration that produced it.

One line per server run (a mode of ``bench-serve --launch`` or one ``--url``), appended, so the
results of many invocations accumulate in one file and stay comparable: the tags say which
``--pp-mode``, pipeline / tensor sizes, chunk size, layer split, SGLang version and device each
line was measured with. Per-request TTFTs and inter-token gaps are kept (``ttfts``, ``itls``, as
SGLang's ``bench_serving`` names them in its own JSONL, whose path each line also gives), so
distributions can be re-plotted later.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

__all__ = ["append_results", "launch_tags", "option_value", "sglang_version"]


def sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def option_value(args: Sequence[str], *names: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in a server argument list (the last one wins)."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def launch_tags(mode: str, pp_size: int, chunked_prefill_size: int, device: str,
                server_args: Sequence[str]) -> dict[str, Any]:
    """The tags of a server ``bench-serve --launch`` started."""
    split = option_value(server_args, "--vpp-layer-split")
    return {"pp_mode": mode, "pp_size": pp_size, "tp_size": int(option_value(server_args, "--tp-size", "--tp") or 1),
            "chunked_prefill_size": chunked_prefill_size,
            "layer_split": [int(x) for x in split.split(",")] if split else None,
            "fold": option_value(server_args, "--vpp-fold") or "split",
            "sglang_version": sglang_version(), "device": device}


def append_results(path: Path, runs: Sequence[Mapping[str, Any]], tags: Sequence[Mapping[str, Any]]) -> None:
    """Append one line per run: its tags, label, summary, pipeline accounting and per-request times."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for run, tag in zip(runs, tags):
            line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tags": dict(tag), "label": run.get("label"),
                    "url": run.get("url"), "workload": run.get("config"), "summary": run.get("summary"),
                    "pipeline": run.get("pipeline"), "ttfts": run.get("ttfts") or [], "itls": run.get("itls") or [],
                    "bench_serving_jsonl": run.get("bench_serving_jsonl")}
            out.write(json.dumps(line) + "\n")
