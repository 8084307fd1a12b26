"""``sglang-vpp bench-serve``: SGLang's own ``bench_serving`` against one server or one per mode.

Job: the load, the datasets and the served-time metrics (TTFT, ITL, E2E) are SGLang's
``bench_serving`` (``serving/bench_serving.py`` runs it and reads its JSONL back), so the numbers
compare one to one with what SGLang users run. What this command adds: ``--launch`` starts each
``--pp-mode`` in turn (``cli/bench_serve_launch.py``), replays each rank's prefill from the
server's ``--vpp-trace`` records, prints the modes side by side (``serving/report.py``) with a
verdict, appends tagged results (``serving/results.py``) and draws plots (``serving/plots.py``).

Wall-clock numbers on a shared 2-vCPU machine do not show a pipeline speedup; see
CONTRIBUTING.md rule 8.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from sglang_vpp.serving.bench_serving import (
    FILE_NEEDS_PATH,
    WORKLOAD_DEFAULTS,
    BenchServeError,
    LoadPlan,
    Workload,
    bench_serving_missing,
    check_fits_context,
    check_reachable,
    local_targets,
    run_pass,
    server_context_len,
)

from sglang_vpp.schedule import check_concurrency
from sglang_vpp.schedule.layout import check_num_ranks
from sglang_vpp.verdict import check_repeats
from sglang_vpp.workload_file import WorkloadRecord, read_workload_file

from .common import MAX_REQUESTS, CliInputError, at_least, at_most, check_output_paths, not_blank, seed_option, parse_size_option, positive, timeout_option, user_errors
from .bench_serve_launch import REPEATS_UNIT, STARTUP_TIMEOUT_S
from .bench_serve_report import WARMUP_SEED_OFFSET, gantt_path
from .common import given_flags, output_option, png_path

__all__ = ["BenchServeError", "bench_serve"]

_FORMATS = ("table", "md", "json")
#: Parameters (by name) that only one way of running reads, with their flags.
_LAUNCH_ONLY = {"model_path": "--model-path", "pp_size": "--pp-size", "chunked_prefill_size": "--chunked-prefill-size",
                "device": "--device", "server_arg": "--server-arg", "repeats": "--repeats",
                "startup_timeout": "--startup-timeout", "port": "--port"}
_URL_ONLY = {"label": "--label", "allow_shared_host": "--allow-shared-host"}


def _looks_local(model_path: str) -> bool:
    """A path meant on this disk, not a Hugging Face repo id (``gpt2``, ``Qwen/Qwen2-0.5B``) SGLang
    would download: checked here, since SGLang fails on a missing directory with a traceback."""
    return model_path.startswith(("/", "./", "../", "~")) or model_path.count("/") > 1


def _parse_targets(urls: list[str], label: str | None) -> list[tuple[str, str]]:
    """``--url`` values as (label, url); ``name=http://...`` names a server, else its URL does."""
    if label is not None and len(urls) > 1:
        raise BenchServeError("--label names a single server; with several --url use name=http://... instead")
    # A blank name would title the server's rows and JSON with nothing.
    if label is not None and not label.strip():
        raise BenchServeError(f"--label {label!r} is empty; give the server a name, e.g. --label vpp-pack")
    targets = []
    for raw in urls:
        name, sep, url = raw.partition("=")
        if not sep or "://" in name:
            name, url = (label or raw), raw
        elif not name.strip():
            raise BenchServeError(f"--url {raw!r} has an empty name before '='; write name=http://..., e.g. "
                                  "vpp-pack=http://127.0.0.1:30000, or the bare URL")
        elif not url.strip():  # else the URL check quotes '' and the name the user wrote is lost
            raise BenchServeError(f"--url {raw!r} has no URL after '='; write name=http://..., e.g. "
                                  "vpp-pack=http://127.0.0.1:30000")
        targets.append((name, url))
    names = [name for name, _ in targets]
    if len(set(names)) != len(names):
        raise BenchServeError(f"--url labels must be distinct, got {names}")
    return targets


def _check_work_dir(work_dir: Path | None) -> None:
    """A --work-dir that could not become a directory fails here, not after the servers ran."""
    if work_dir is None:
        return
    existing = work_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == work_dir else f"is inside {str(existing)!r}, a file"
        raise BenchServeError(f"--work-dir {str(work_dir)!r} {where}; give a directory (made if missing)")


def _file_records(file: Path | None, request_rate: float, sizes: dict[str, int | None],
                  num_requests: int | None, timeout: float) -> list[WorkloadRecord]:
    """``--workload file``: the requests a pass serves (the first ``--num-requests``, else all),
    read before any work; their lengths and arrivals exclude the flags that would set them another way."""
    if file is None:
        raise BenchServeError(FILE_NEEDS_PATH)
    clashing = [flag for flag in ("--input-len", "--max-input-len") if sizes[flag] is not None]
    if math.isfinite(request_rate):
        clashing.append("--request-rate")
    if clashing:
        raise BenchServeError(f"--workload file takes lengths and arrival times from {file}; drop {', '.join(clashing)}")
    records = read_workload_file(file)
    if num_requests is not None and num_requests > len(records):
        raise BenchServeError(f"--num-requests {num_requests}: {file} holds {len(records)} request(s)")
    served = records[: num_requests or len(records)]
    if served[-1].arrival >= timeout:
        raise BenchServeError(f"{file}: the last request arrives at {served[-1].arrival:g} s, past --timeout "
                              f"{timeout:g} s for one pass; raise --timeout")
    return served


@user_errors
def bench_serve(
    ctx: typer.Context,
    url: Optional[list[str]] = typer.Option(None, "--url", help="Server base URL, e.g. http://127.0.0.1:30000; repeat as name=URL to compare servers side by side."),
    launch: Optional[str] = typer.Option(None, "--launch", help="Instead of --url: start one server per --pp-mode in turn (e.g. cpp,vpp-pack or all) and compare them, with per-rank prefill idle."),
    model_path: Optional[str] = typer.Option(None, "--model-path", help="--launch: the model (default: a tiny 8-layer Qwen2 built locally)."),
    pp_size: int = typer.Option(2, "--pp-size", help="--launch: pipeline ranks."),
    chunked_prefill_size: str = typer.Option("64", "--chunked-prefill-size", help="--launch: the chunk size (dcpp: its base chunk); 64, 1k, ...; auto: vpp modes size their own chunks, cpp/dcpp get auto's cap."),
    device: str = typer.Option("cpu", "--device", help="--launch: SGLang --device (cpu adds torch_native attention and fp32)."),
    server_arg: Optional[list[str]] = typer.Option(None, "--server-arg", help="--launch: one more launch_server argument, repeatable (e.g. --server-arg=--max-total-tokens --server-arg=32768)."),
    repeats: int = typer.Option(3, "--repeats", help="--launch: measured bench_serving passes per server (idle spread and verdict ranges are over repeats; 1 gives no verdict)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Where server logs, traces and bench_serving's JSONL and logs go (default: a new temporary directory)."),
    startup_timeout: float = typer.Option(STARTUP_TIMEOUT_S, "--startup-timeout", help="--launch: seconds a server may take to become healthy."),
    pd: bool = typer.Option(False, "--pd", help="--launch: serve each mode as the prefill server of a prefill-decode split (one pp-1 decode server, SGLang's router, Mooncake over TCP); docs/pd.md."),
    port: Optional[int] = typer.Option(None, "--port", help="--launch: the first server's port; the next mode gets the next port (default: free ports)."),
    workload: Workload = typer.Option(Workload.SHORT, "--workload", help="Preset of bench_serving's random-ids dataset: long (4 x 8k, one at a time), short (16 x 1k, 16 at once), mixed (lengths uniform up to 2x --input-len), or file (--file: the requests of a workload file, the format simulate reads)."),
    num_requests: Optional[int] = typer.Option(None, "--num-requests", "--num-prompts", help="Requests per pass (preset default)."),
    input_len: Optional[str] = typer.Option(None, "--input-len", help="Input tokens (--random-input-len): 1024, 8k, ..."),
    output_len: Optional[str] = typer.Option(None, "--output-len", help="Output tokens per request (--random-output-len)."),
    max_input_len: Optional[str] = typer.Option(None, "--max-input-len", help="mixed: the longest input (default 2x --input-len)."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "--max-concurrency", help="Requests in flight at most (preset default)."),
    request_rate: float = typer.Option(math.inf, "--request-rate", help="Poisson arrivals per second (default: all at once)."),
    file: Optional[Path] = typer.Option(None, "--file", help='--workload file: JSONL, one request per line: {"length": tokens, "arrival": seconds, "output_len": tokens}; arrival and output_len optional (docs/cli.md).'),
    dataset_name: Optional[str] = typer.Option(None, "--dataset-name", help="Any bench_serving dataset instead of the preset's random-ids (random, sharegpt, generated-shared-prefix, ...)."),
    dataset_path: Optional[Path] = typer.Option(None, "--dataset-path", help="bench_serving --dataset-path (random and sharegpt need a local ShareGPT JSON here; nothing is downloaded)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer for bench_serving (default: --launch's model; with --url the server's)."),
    flush_cache: bool = typer.Option(False, "--flush-cache", help="bench_serving --flush-cache: empty the prefix cache after warm-up."),
    bench_arg: Optional[list[str]] = typer.Option(None, "--bench-arg", help="One more bench_serving argument, passed through unchanged, repeatable (e.g. --bench-arg=--disable-stream)."),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size", help="Not used: bench_serving draws token ids from the tokenizer's vocabulary (an error if given)."),
    seed: int = typer.Option(0, "--seed", help="bench_serving --seed (repeat r uses seed + r)."),
    warmup: int = typer.Option(1, "--warmup", "--warmup-requests", help="Warm-up requests before measuring (bench_serving --warmup-requests)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds one bench_serving pass may take."),
    label: Optional[str] = typer.Option(None, "--label", help="Name of this run in the table and JSON (e.g. the pp mode)."),
    json_out: Optional[Path] = output_option("--json", help="Write config, summaries, per-request TTFT/ITL and (--launch) pipeline records' replay."),
    plot: Optional[Path] = output_option("--plot", help="PNG of TTFT / ITL / E2E per server; with --launch also PATH-gantt.png, each rank's replayed prefill per mode."),
    output_file: Optional[Path] = output_option("--output-file", help="Append one JSON line per server run, tagged with its configuration (pp-mode, pp/tp size, chunk size, layer split, SGLang version, device)."),
    fmt: str = typer.Option("table", "--format", help="table (fits 80 columns), md, or json (the --json document on stdout)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress (bench_serving's bar, server start-up)."),
    allow_failures: bool = typer.Option(False, "--allow-failures", help="Exit 0 and give the verdict over the requests served even when some failed (an error or no output)."),
    allow_shared_host: bool = typer.Option(False, "--allow-shared-host", help="Compare several --url servers that run on this host at once (each steals CPU from the others: the table says so)."),
) -> None:
    """Measure TTFT, ITL and end-to-end latency of SGLang servers with SGLang's bench_serving.

    With several --url (e.g. --url cpp=http://127.0.0.1:30000 --url vpp-pack=http://127.0.0.1:30001)
    the same load runs against each in turn and a side-by-side table follows. With --launch
    MODES the command starts each server itself (one at a time), adds each rank's prefill idle
    (replayed from per-stage CPU time, see docs/cli.md), ends with a verdict and stops it again.
    """
    if (url is None) == (launch is None):
        raise BenchServeError("give either --url (running servers) or --launch MODES (start them), not both or neither")
    if pd and launch is None:
        raise BenchServeError("--pd starts a prefill-decode split per mode: give it with --launch MODES")
    # A flag of the other way of running would be ignored: the run would not be the one asked for.
    unread = _LAUNCH_ONLY if launch is None else _URL_ONLY
    ignored = given_flags(ctx, unread)
    if ignored:
        raise BenchServeError(f"{', '.join(ignored)} {'apply' if len(ignored) > 1 else 'applies'} to "
                              f"{'--launch' if launch is None else '--url'} only; drop "
                              f"{'them' if len(ignored) > 1 else 'it'} with {'--url' if launch is None else '--launch'}")
    if vocab_size is not None:
        raise BenchServeError(f"--vocab-size {vocab_size}: bench_serving draws token ids from the tokenizer's "
                              "vocabulary; drop --vocab-size (or give --tokenizer)")
    if fmt not in _FORMATS:
        raise BenchServeError(f"--format {fmt!r}: choose table, md or json")
    at_least(num_requests, 1, "--num-requests")
    at_most(num_requests, MAX_REQUESTS, "--num-requests", "(requests per pass)")
    check_concurrency(concurrency, "--concurrency", error=CliInputError)
    at_least(warmup, 0, "--warmup")
    at_most(warmup, MAX_REQUESTS, "--warmup", "(requests per pass)")
    check_repeats(repeats, "--repeats", REPEATS_UNIT)
    seed_option(seed, offset=0 if launch is None else max(repeats - 1, WARMUP_SEED_OFFSET))
    check_num_ranks(pp_size, flag="--pp-size")
    positive(request_rate, "--request-rate")
    not_blank(model_path, "--model-path", "give a local model directory or a Hugging Face repo id, or drop "
              "--model-path for the tiny default")
    not_blank(device, "--device", "give SGLang's device (cpu, cuda, npu, ...), or drop --device for cpu")
    not_blank(tokenizer, "--tokenizer", "give a tokenizer name or directory, or drop --tokenizer for the "
              "model's")
    not_blank(dataset_name, "--dataset-name", "give a bench_serving dataset (random, sharegpt, ...), or drop it "
              "for the workload's random-ids")
    for flag, values, example in (("--server-arg", server_arg, "--max-total-tokens"),
                                  ("--bench-arg", bench_arg, "--disable-stream")):
        for value in values or ():
            not_blank(value, flag, f"give one argument per {flag}, e.g. {flag}={example}")
    timeout_option(timeout, "--timeout")
    timeout_option(startup_timeout, "--startup-timeout")
    plot = png_path(plot)  # matplotlib writes out.png for --plot out
    gantt = [] if plot is None or launch is None else [(gantt_path(plot), "--plot's -gantt.png")]
    check_output_paths((json_out, "--json"), (output_file, "--output-file"), (plot, "--plot", gantt),
                       inputs=((file, "--file"), (dataset_path, "--dataset-path")))
    _check_work_dir(work_dir)
    from ..schedule.auto_size import AUTO, is_auto

    auto_chunk = is_auto(chunked_prefill_size)
    sizes = {flag: parse_size_option(text, flag) for flag, text in (
        ("--input-len", input_len), ("--output-len", output_len), ("--max-input-len", max_input_len),
        ("--chunked-prefill-size", None if auto_chunk else chunked_prefill_size))}  # fmt: skip
    if auto_chunk:
        sizes["--chunked-prefill-size"] = AUTO
    for flag in ("--input-len", "--output-len", "--max-input-len"):
        at_least(sizes[flag], 1, flag)
    if sizes["--max-input-len"] is not None and workload == Workload.MIXED and sizes["--input-len"] is not None:
        raise BenchServeError("--workload mixed draws lengths up to --max-input-len, which leaves --input-len "
                              "unread; drop --input-len (--max-input-len defaults to twice it)")
    if sizes["--max-input-len"] is not None and workload not in (Workload.MIXED, Workload.FILE):
        raise BenchServeError(f"--max-input-len is read only with --workload mixed; --workload {workload.value} "
                              "sends --input-len tokens per prompt, drop --max-input-len")
    default_num, default_in, default_out, default_conc = WORKLOAD_DEFAULTS[workload]
    if file is not None and workload != Workload.FILE:
        raise BenchServeError(f"--file {file} is read with --workload file only (bench_serving's own files: "
                              "--dataset-name NAME --dataset-path FILE)")
    if workload == Workload.FILE:
        served = _file_records(file, request_rate, sizes, num_requests, timeout)
        default_num = default_conc = len(served)
        default_in = max(r.length for r in served)

    def given(value: int | None, default: int) -> int:
        return default if value is None else value

    plan = LoadPlan(
        workload=workload, num_requests=given(num_requests, default_num),
        input_len=given(sizes["--input-len"], default_in), output_len=given(sizes["--output-len"], default_out),
        concurrency=given(concurrency, default_conc), request_rate=request_rate, seed=seed, warmup=warmup,
        max_input_len=sizes["--max-input-len"], dataset_name=dataset_name, dataset_path=dataset_path,
        workload_file=file,
        tokenizer=tokenizer, flush_cache=flush_cache, timeout=timeout, extra_args=tuple(bench_arg or ()),
        progress=progress and fmt != "json",
    )  # fmt: skip
    # Poisson arrivals at this rate take about N / rate seconds: a pass past --timeout would only
    # be cut off, after the whole wait.
    if math.isfinite(request_rate) and plan.num_requests / request_rate > timeout:
        raise BenchServeError(f"--request-rate {request_rate:g} sends {plan.num_requests} requests over about "
                              f"{plan.num_requests / request_rate:g} s, past --timeout {timeout:g} s for one pass; "
                              "raise --request-rate or --timeout")
    modes = None
    if launch is not None:
        from .bench_serve_launch import check_can_launch, parse_modes, port_range_error

        modes = parse_modes(launch)
        if model_path is not None and _looks_local(model_path) and not Path(model_path).expanduser().is_dir():
            raise BenchServeError(f"--model-path {model_path!r} is not a directory; give a local model directory "
                                  "or a Hugging Face repo id like Qwen/Qwen2-0.5B")
        port_error = port_range_error(port, len(modes)) if port is not None else None
        if port_error:
            raise BenchServeError(port_error)
    targets = _parse_targets(url, label) if url is not None else []
    plan.check()
    missing = bench_serving_missing()
    if missing:
        raise BenchServeError(missing)
    if workload == Workload.FILE:
        from sglang_vpp.serving.file_load import HookTargetMissing, check_targets

        try:
            check_targets()  # before any server starts; each pass checks again
        except HookTargetMissing as error:
            raise BenchServeError(str(error)) from None
    shared = local_targets(targets) if len(targets) > 1 else []
    if len(shared) > 1 and not allow_shared_host:
        raise BenchServeError(
            f"--url {', '.join(shared)}: these servers run on this host at once, and an idle SGLang scheduler "
            "busy-waits about a core, so each would be measured while the others steal CPU; compare them one "
            "at a time (bench-serve --launch MODES starts and stops each in turn), or pass --allow-shared-host")
    for _name, target in targets:
        check_reachable(target)  # every --url checked before any load
        check_fits_context(plan, target, server_context_len(target))
    if launch is not None:
        check_can_launch()  # SGLang and transformers, before the default model is built
    from .bench_serve_launch import make_work_dir

    if launch is not None:
        from dataclasses import replace

        from .bench_serve_launch import LaunchSpec, default_model_dir

        # No work dir yet: the checks below may still refuse, and a refusal leaves nothing behind.
        spec = LaunchSpec(
            model_dir=model_path or default_model_dir(), pp_size=pp_size,
            chunked_prefill_size=sizes["--chunked-prefill-size"], device=device, server_args=tuple(server_arg or ()),
            startup_timeout=startup_timeout, first_port=port or 0, pd=pd,
        )  # fmt: skip
        from .bench_serve_launch import check_launch_args, model_context_len

        check_launch_args(spec, modes)  # the checks bench and the plugin make, before any server starts
        check_fits_context(plan, f"--model-path {spec.model_dir}", model_context_len(spec))
        if plan.tokenizer is None:
            plan = replace(plan, tokenizer=spec.model_dir)
        out_dir = make_work_dir(work_dir)
        spec = replace(spec, work_dir=out_dir)
        from .bench_serve_report import bench_launched

        bench_launched(modes, spec, plan, repeats, out_dir, json_out, output_file, plot, fmt, allow_failures)
        return
    from sglang_vpp.serving.bench_worker import BenchServingWorker

    from .bench_serve_report import finish, run_entry

    out_dir = make_work_dir(work_dir)
    runs = []
    with BenchServingWorker() as worker:
        for name, target in targets:
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            serving_pass = run_pass(plan, target, out_dir / f"bench-serving-{safe}.jsonl",
                                    out_dir / f"bench-serving-{safe}.log", seed_offset=0, worker=worker)  # fmt: skip
            shown = name if (label is not None or len(url) > 1) else None
            runs.append(run_entry(shown, target, plan.describe(), [serving_pass]))
    document = runs[0] if len(runs) == 1 else {"runs": runs}
    notes = []
    if len(shared) > 1:
        notes.append(f"shared host: {', '.join(shared)} ran on this host at once (--allow-shared-host); each idle "
                     "SGLang scheduler busy-waits about a core, so each server's times include the others' load: "
                     "not a comparison of the servers")
        document["shared_host"] = shared
    finish(runs, document, [], json_out, output_file, plot, fmt,
           tags=[{"label": run["label"], "url": run["url"]} for run in runs], notes=notes,
           allow_failures=allow_failures, work_dir=out_dir)
