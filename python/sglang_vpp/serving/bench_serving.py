"""Load from SGLang's own ``bench_serving``: one pass = one ``python -m sglang.benchmark.serving`` command
line, run in a warm interpreter that imported the module once (``serving/bench_worker.py``).

``sglang.bench_serving`` is the deprecated import path of the same module in SGLang 0.5.23; this
module runs the new path so no deprecation warning lands in the logs. Each pass writes its JSONL
(``--output-file --output-details``: the aggregate metrics and per-request ``ttfts`` / ``itls``),
which is kept next to the server logs and read back into a ``ServingPass``. Nothing here measures
a request itself: every number is bench_serving's.

Presets (``--workload``) are shorthands for bench_serving's ``random-ids`` dataset (token ids drawn
from the tokenizer's vocabulary, no download); ``--workload file`` serves the requests of a
workload file (the format ``simulate`` reads: exact lengths and arrival times) through
bench_serving with its dataset and pacing hooked (``serving/file_load.py``); ``--dataset-name`` picks any of its datasets
(``random`` and ``sharegpt`` need ``--dataset-path`` to a ShareGPT JSON file here: nothing is
downloaded), and ``--bench-arg`` passes any other bench_serving flag through unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import statistics
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .bench_worker import BENCH_SERVING_MODULE, FILE_LOAD_MODULE, BenchServingWorker, WorkerDied

__all__ = ["BENCH_SERVING_MODULE", "FILE_NEEDS_PATH", "BenchServeError", "LoadPlan", "ServingPass", "Workload", "WORKLOAD_DEFAULTS",
           "bench_serving_missing", "check_fits_context", "check_reachable", "local_targets", "merge_passes",
           "run_pass", "server_context_len"]


class BenchServeError(ValueError):
    """A bad bench-serve option or an unusable server; the message names the value and the fix."""


class Workload(StrEnum):
    LONG = "long"
    SHORT = "short"
    MIXED = "mixed"
    FILE = "file"


# Per preset: (num_requests, input_len, output_len, concurrency); ``file`` takes the number of
# requests and their lengths from the file and limits nothing (its arrivals are the load).
WORKLOAD_DEFAULTS: dict[Workload, tuple[int, int, int, int]] = {
    Workload.LONG: (4, 8192, 16, 1),
    Workload.SHORT: (16, 1024, 16, 16),
    Workload.MIXED: (32, 1024, 16, 16),
    Workload.FILE: (0, 0, 16, 0),
}
FILE_NEEDS_PATH = ("--workload file needs --file PATH: a JSONL workload file, one request per line, like "
                   '{"length": 4096, "arrival": 0.5} (the format simulate reads)')
#: bench_serving flags that would replace or bypass what ``--workload file`` hooks (its rows, its
#: pacing) or send the token-id rows to an endpoint that does not take ids.
_FILE_CLASHING_BENCH_ARGS = ("--dataset-name", "--dataset-path", "--request-rate", "--rust-client", "--backend",
                             "--tokenize-prompt", "--random-input-len", "--random-range-ratio")
#: mixed: lengths uniform in [ratio * upper, upper] with upper = 2 * --input-len, so the median
#: is close to --input-len (bench_serving's --random-range-ratio draws uniformly).
_MIXED_RANGE_RATIO = 0.05


def bench_serving_missing() -> str | None:
    """Why bench_serving cannot run here (one line), or None."""
    # bench_serving imports ``datasets`` at module level (its MMMU loader), which SGLang's CPU
    # install did not need before; both are checked without importing SGLang (seconds).
    missing = [name for name in ("sglang", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"bench-serve drives load with SGLang's bench_serving, which needs {' and '.join(missing)} "
                "(not installed); run scripts/install_sglang_cpu.sh (CPU) or pip install sglang==0.5.23")
    return None


def check_reachable(url: str, timeout: float = 10.0) -> None:
    """A fast, clear failure for a server that is not there (bench_serving would wait 60 s)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError as error:  # e.g. an unclosed IPv6 bracket
        raise BenchServeError(f"--url {url!r} is not a URL ({error}); it must look like http://127.0.0.1:30000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchServeError(f"--url {url!r} must look like http://127.0.0.1:30000")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise BenchServeError(f"--url {url!r}: the port must be a number in 1..65535, e.g. http://127.0.0.1:30000")
    try:
        urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout).read()
    except urllib.error.HTTPError as error:
        if error.code == 404:  # bench_serving would wait 60 s for a /v1/models that never comes
            raise BenchServeError(f"{url} answers but has no /v1/models (HTTP 404); is it an SGLang server "
                                  "(the base URL, without a path)?") from None
        return  # it answers; bench_serving reports what it cannot use (a 503 while starting: it waits)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)  # URLError wraps the socket error
        text = getattr(reason, "strerror", None) or str(reason) or reason.__class__.__name__
        raise BenchServeError(f"{url} does not answer ({text}); is the server up?") from None


def server_context_len(url: str, timeout: float = 10.0) -> int | None:
    """The server's context length (``max_model_len`` of ``/v1/models``), or None if it does not say."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as response:
            cards = json.loads(response.read()).get("data") or []
    except (OSError, ValueError):
        return None
    lengths = [card.get("max_model_len") for card in cards if isinstance(card, dict)]
    return next((int(n) for n in lengths if isinstance(n, int) and n > 0), None)


def _is_local_address(address: str) -> bool:
    import ipaddress
    import socket

    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:  # only an address of one of this host's interfaces can be bound here
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def local_targets(targets: list[tuple[str, str]]) -> list[str]:
    """The labels of ``(label, url)`` targets served from this host (loopback or a local address)."""
    import socket
    from urllib.parse import urlsplit

    local = []
    for name, url in targets:
        host = urlsplit(url).hostname or ""
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except (OSError, UnicodeError):
            continue  # check_reachable reports a host that does not resolve
        if any(_is_local_address(address) for address in addresses):
            local.append(name)
    return local


@dataclass(frozen=True)
class LoadPlan:
    """One bench_serving pass's flags, the same for every server and repeat but the seed."""

    workload: Workload
    num_requests: int
    input_len: int
    output_len: int
    concurrency: int
    request_rate: float = math.inf
    seed: int = 0
    warmup: int = 1
    max_input_len: int | None = None
    dataset_name: str | None = None
    dataset_path: Path | None = None
    tokenizer: str | None = None
    flush_cache: bool = False
    timeout: float = 600.0
    extra_args: tuple[str, ...] = ()
    progress: bool = True
    workload_file: Path | None = None
    """``--workload file``: the workload file (``sglang_vpp.workload_file``) whose requests are served."""

    def dataset(self) -> str:
        return self.dataset_name or "random-ids"

    def check(self) -> None:
        if self.workload == Workload.FILE:
            if self.workload_file is None:
                raise BenchServeError(FILE_NEEDS_PATH)
            clashing = sorted({arg.split("=")[0] for arg in self.extra_args} & set(_FILE_CLASHING_BENCH_ARGS))
            if clashing:
                raise BenchServeError(f"--workload file sets bench_serving's dataset, pacing and backend; drop "
                                      f"--bench-arg={', --bench-arg='.join(clashing)}")
            if self.dataset_name or self.dataset_path:
                raise BenchServeError("--workload file serves the requests of --file; drop --dataset-name/--dataset-path "
                                      "(or drop --workload file to use a bench_serving dataset)")
        if self.dataset_path is not None and not self.dataset_path.is_file():
            what = "a directory, not a file" if self.dataset_path.is_dir() else "no such file"
            raise BenchServeError(f"--dataset-path {self.dataset_path}: {what}")
        if self.dataset() in ("random", "sharegpt") and self.dataset_path is None:
            raise BenchServeError(f"--dataset-name {self.dataset()} samples ShareGPT, which would be downloaded; give "
                                  "--dataset-path FILE (a local ShareGPT JSON) or use random-ids")

    def longest_prompt(self) -> int | None:
        """The longest prompt a pass sends, where this plan sets it (None for other datasets)."""
        if self.workload == Workload.FILE:
            return self.input_len
        if self.dataset() not in ("random-ids", "random"):
            return None
        return self.max_input_len or 2 * self.input_len if self.workload == Workload.MIXED else self.input_len

    def expected_output_len(self) -> int | None:
        """Output tokens every request asks for (bench_serving ignores EOS), where the plan sets it."""
        if self.workload == Workload.FILE or self.dataset() not in ("random-ids", "random", "sharegpt"):
            return None  # per-request (workload file) or the dataset's own lengths
        return self.output_len

    def argv(self, url: str, output_file: Path, *, seed_offset: int, num_requests: int | None = None,
             warmup: int | None = None, paced: bool = True) -> list[str]:
        """The bench_serving command line of one pass (``paced=False``: a warm-up pass of a workload
        file sends its requests at once instead of at their arrival times)."""
        input_len, ratio = self.input_len, 1.0
        if self.workload == Workload.MIXED:
            input_len, ratio = self.max_input_len or 2 * self.input_len, _MIXED_RANGE_RATIO
        program = [sys.executable, "-m", BENCH_SERVING_MODULE]
        if self.workload == Workload.FILE:
            from .file_load import WORKLOAD_FILE_FLAG

            program = [sys.executable, "-m", FILE_LOAD_MODULE, WORKLOAD_FILE_FLAG, str(self.workload_file)]
            if paced:
                program.append("--use-trace-timestamps")  # bench_serving's flag; file_load paces by it
        args = [
            *program, "--backend", "sglang", "--base-url", url,
            "--dataset-name", self.dataset(), "--num-prompts", str(num_requests or self.num_requests),
            "--random-input-len", str(input_len), "--random-output-len", str(self.output_len),
            "--random-range-ratio", str(ratio), "--seed", str(self.seed + seed_offset),
            "--warmup-requests", str(self.warmup if warmup is None else warmup),
            "--max-concurrency", str(self.concurrency), "--output-file", str(output_file), "--output-details",
        ]  # fmt: skip
        if self.dataset() in ("random-ids", "random"):
            # Token ids as drawn: as text the server would re-tokenize them into another length.
            args.append("--tokenize-prompt")
        if math.isfinite(self.request_rate):
            args += ["--request-rate", str(self.request_rate)]
        if self.dataset() in ("sharegpt", "custom"):
            args += ["--sharegpt-output-len", str(self.output_len)]
        if self.dataset_path is not None:
            args += ["--dataset-path", str(self.dataset_path)]
        if self.tokenizer:
            args += ["--tokenizer", self.tokenizer, "--model", self.tokenizer]
        if self.flush_cache:
            args.append("--flush-cache")
        if not self.progress:
            args.append("--disable-tqdm")
        return args + list(self.extra_args)

    def describe(self) -> dict[str, Any]:
        return {
            "workload": str(self.workload), "dataset_name": self.dataset(), "num_requests": self.num_requests,
            "input_len": self.input_len, "output_len": self.output_len, "max_concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate, "seed": self.seed,
            "warmup_requests": self.warmup, "flush_cache": self.flush_cache, "bench_args": list(self.extra_args),
            "load_generator": f"python -m {BENCH_SERVING_MODULE}" + (
                " (dataset and pacing from the workload file)" if self.workload == Workload.FILE else ""),
            "workload_file": None if self.workload_file is None else str(self.workload_file),
        }  # fmt: skip


@dataclass
class ServingPass:
    """What one bench_serving pass reported (its JSONL line), seconds for per-request lists."""

    metrics: dict[str, Any]
    ttfts: list[float] = field(default_factory=list)
    itls: list[list[float]] = field(default_factory=list)
    input_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    output_file: str | None = None

    @property
    def num_requests(self) -> int:
        return len(self.ttfts)

    @property
    def num_failed(self) -> int:
        return sum(1 for e in self.errors if e)

    def ok_ttfts(self) -> list[float]:
        return [t for t, e in zip(self.ttfts, self.errors) if not e]

    def ok_itls(self) -> list[float]:
        return [x for itl, e in zip(self.itls, self.errors) if not e for x in itl]

    def e2e(self) -> list[float]:
        """Per successful request: TTFT plus its inter-token gaps (its streamed latency)."""
        return [t + sum(itl) for t, itl, e in zip(self.ttfts, self.itls, self.errors) if not e]


def _stats_ms(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    p99 = ordered[0] if len(ordered) == 1 else statistics.quantiles(ordered, n=100, method="inclusive")[98]
    return {"mean": statistics.fmean(ordered) * 1e3, "median": statistics.median(ordered) * 1e3, "p99": p99 * 1e3,
            "count": len(ordered)}


def merge_passes(passes: list[ServingPass]) -> dict[str, Any]:
    """Summary over several passes (repeats) from their per-request lists: TTFT, ITL, E2E in ms
    (mean / median / p99), token counts and throughput over the summed durations."""
    merged = ServingPass(metrics={})
    for p in passes:
        merged.ttfts += p.ttfts
        merged.itls += p.itls
        merged.errors += p.errors
        merged.input_lens += p.input_lens
        merged.output_lens += p.output_lens
    duration = sum(float(p.metrics.get("duration") or 0.0) for p in passes)
    ok = [i for i, e in enumerate(merged.errors) if not e]
    input_tokens = sum(merged.input_lens[i] for i in ok)
    output_tokens = sum(merged.output_lens[i] for i in ok)
    return {
        "num_requests": merged.num_requests, "num_failed": merged.num_failed, "duration_s": duration,
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "output_throughput": output_tokens / duration if duration else None,
        "total_throughput": (input_tokens + output_tokens) / duration if duration else None,
        "ttft_ms": _stats_ms(merged.ok_ttfts()), "itl_ms": _stats_ms(merged.ok_itls()),
        "e2e_ms": _stats_ms(merged.e2e()),
        "errors": sorted({e.strip().splitlines()[-1][:200] for e in merged.errors if e})[:5],
    }  # fmt: skip


def check_fits_context(plan: LoadPlan, url: str, context_len: int | None) -> None:
    """Refuse a load whose prompts (plus their output) do not fit the server's context: SGLang
    rejects each such request, which would otherwise reach the table as a served one."""
    longest = plan.longest_prompt()
    if context_len is None or longest is None:
        return
    need = longest + plan.output_len
    if need > context_len:
        raise BenchServeError(
            f"{url}: prompts of up to {longest} tokens plus {plan.output_len} output tokens ({need}) do not fit "
            f"the server's context length {context_len}; lower --input-len (mixed: --max-input-len) to at most "
            f"{max(1, context_len - plan.output_len)}, or serve a model with a longer context")


def _aligned_output_lens(record: dict[str, Any]) -> list[int]:
    """Output tokens per request: bench_serving lists one per request, 0 for a failed one."""
    lengths = list(record.get("output_lens") or [])
    count = max(len(record.get("errors") or []), len(record.get("ttfts") or []))
    return lengths + [0] * (count - len(lengths))


def _failures(record: dict[str, Any], expected: int | None) -> list[str]:
    """Per request: bench_serving's error, else why the request was not served, else "".

    bench_serving counts a request whose stream carried no token (SGLang streams a rejection such
    as a prompt longer than the context as an error event) as a success with TTFT 0: that is a
    failure. A shorter count than asked is not: bench_serving reads the server's
    ``completion_tokens`` from the last streamed chunk *with text*, and a byte-level tokenizer's
    last tokens can decode to no text yet (a partial UTF-8 sequence), so a request served in full
    can count fewer tokens (seen: 2 of 5 on the tiny model). ``expected`` only names the asked
    length in the reason of a request that got no token."""
    errors = [e or "" for e in record.get("errors") or []]
    ttfts, texts = record.get("ttfts") or [], record.get("generated_texts") or []
    out = []
    for i in range(max(len(ttfts), len(errors))):
        error = errors[i] if i < len(errors) else ""
        if error:
            out.append(error)
        elif (i < len(ttfts) and not ttfts[i] > 0) or (i < len(texts) and not texts[i]):
            asked = f" of {expected} asked" if expected is not None else ""
            out.append(f"no output: the server sent no token{asked} (rejected?)")
        else:
            out.append("")
    return out


def _last_line(log_file: Path) -> str:
    tail = [line for line in log_file.read_text(errors="replace").splitlines() if line.strip()][-1:]
    return tail[0][:300] if tail else "no output"


def run_pass(plan: LoadPlan, url: str, output_file: Path, log_file: Path, *, seed_offset: int = 0,
             num_requests: int | None = None, warmup: int | None = None, paced: bool = True,
             worker: BenchServingWorker | None = None) -> ServingPass:
    """Run bench_serving once against ``url``; its stdout goes to ``log_file``, its JSONL line to
    ``output_file`` (appended, as bench_serving does). ``worker``: the warm interpreter that runs
    the pass (``serving/bench_worker.py``; a command's passes share one), else one for this pass."""
    output_file.parent.mkdir(parents=True, exist_ok=True)
    before = output_file.read_text().count("\n") if output_file.exists() else 0
    argv = plan.argv(url, output_file, seed_offset=seed_offset, num_requests=num_requests, warmup=warmup, paced=paced)
    with log_file.open("a") as log:
        log.write("$ " + " ".join(argv) + "\n")
    with contextlib.ExitStack() as stack:
        pass_worker = worker if worker is not None else stack.enter_context(BenchServingWorker())
        try:
            returncode = pass_worker.run(argv, log_file, plan.timeout)
        except TimeoutError:
            raise BenchServeError(f"bench_serving against {url} ran past --timeout {plan.timeout:g} s "
                                  f"(log {log_file})") from None
        except WorkerDied as died:
            raise BenchServeError(f"bench_serving against {url} failed ({died}): {_last_line(log_file)} "
                                  f"(log {log_file})") from None
    lines = output_file.read_text().splitlines() if output_file.exists() else []
    if returncode != 0 or len(lines) <= before:
        raise BenchServeError(f"bench_serving against {url} failed (exit {returncode}): {_last_line(log_file)} "
                              f"(log {log_file})")
    record = json.loads(lines[-1])
    return ServingPass(
        metrics={k: v for k, v in record.items()
                 if k not in ("ttfts", "itls", "input_lens", "output_lens", "errors", "generated_texts")},
        ttfts=list(record.get("ttfts") or []), itls=[list(x) for x in record.get("itls") or []],
        input_lens=list(record.get("input_lens") or []), output_lens=_aligned_output_lens(record),
        errors=_failures(record, plan.expected_output_len()),
        output_file=str(output_file),
    )  # fmt: skip
