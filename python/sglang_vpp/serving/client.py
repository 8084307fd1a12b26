"""The HTTP client of ``sglang-vpp bench-serve``: streaming ``/generate`` requests, timed.

``run_requests`` sends a workload with at most ``concurrency`` requests in flight (optionally
Poisson arrivals), each POST /generate {"stream": true} read as server-sent events ->
``RequestResult`` (TTFT = first streamed token, latency = last event, token counts);
``summarize`` -> min / median / max / p90 of TTFT, latency and time per output token, and
throughput = tokens / wall clock of the measured requests. Standard library only.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from .workload import BenchRequest, BenchServeError

__all__ = ["RequestResult", "Stats", "Summary", "connection", "run_requests", "send_streaming", "server_info",
           "summarize"]


@dataclass(slots=True)
class RequestResult:
    """What one request measured. Times in seconds; ``start`` is relative to the run start."""

    index: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def time_per_output_token(self) -> float | None:
        if not self.ok or self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Stats:
    """min / median / max / p90 (linear interpolation) and mean of a metric."""

    min: float
    median: float
    max: float
    p90: float
    mean: float
    count: int

    @classmethod
    def of(cls, values: list[float]) -> Optional["Stats"]:
        if not values:
            return None
        ordered = sorted(values)
        p90 = ordered[0] if len(ordered) == 1 else statistics.quantiles(ordered, n=10, method="inclusive")[8]
        return cls(
            min=ordered[0],
            median=statistics.median(ordered),
            max=ordered[-1],
            p90=p90,
            mean=statistics.fmean(ordered),
            count=len(ordered),
        )


@dataclass
class Summary:
    """Aggregates of one run (the ``summary`` object of the JSON output)."""

    num_requests: int
    num_failed: int
    wall_seconds: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    ttft: Stats | None = None
    latency: Stats | None = None
    time_per_output_token: Stats | None = None
    errors: list[str] = field(default_factory=list)





def connection(url: str, timeout: float):
    import http.client

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchServeError(f"--url {url!r} must look like http://127.0.0.1:30000")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise BenchServeError(f"--url {url!r}: the port must be a number in 1..65535, e.g. http://127.0.0.1:30000")
    conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return conn_class(parts.hostname, port, timeout=timeout), parts.path.rstrip("/")


def send_streaming(url: str, request: BenchRequest, timeout: float, run_start: float) -> RequestResult:
    """POST /generate with streaming and time it. Never raises: failures land in the result."""
    result = RequestResult(index=request.index, input_tokens=request.input_len or 0)
    began = time.perf_counter()
    result.start = began - run_start
    try:
        conn, prefix = connection(url, timeout)
        body = json.dumps(request.payload()).encode()
        conn.request("POST", prefix + "/generate", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:300]!r}"
            return result
        last: dict[str, Any] | None = None
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                result.error = str(event["error"])[:300]
                return result
            meta = event.get("meta_info", {})
            if result.ttft is None and (meta.get("completion_tokens", 1) >= 1):
                result.ttft = time.perf_counter() - began
            last = event
        result.latency = time.perf_counter() - began
        conn.close()
        if last is None:
            result.error = "the stream ended without any event"
            return result
        meta = last.get("meta_info", {})
        result.output_tokens = int(meta.get("completion_tokens", 0))
        result.input_tokens = int(meta.get("prompt_tokens", result.input_tokens))
        result.ok = True
    except Exception as exc:  # noqa: BLE001 - a benchmark reports failures, it does not crash
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def run_requests(
    url: str,
    requests: list[BenchRequest],
    *,
    concurrency: int,
    request_rate: float = math.inf,
    timeout: float = 600.0,
    seed: int = 0,
    on_done: Callable[[RequestResult], None] | None = None,
) -> tuple[list[RequestResult], float]:
    """Send ``requests`` with at most ``concurrency`` in flight; return (results, wall seconds).

    With a finite ``request_rate`` (requests/s), arrivals follow a Poisson process (seeded).
    """
    if concurrency < 1:
        raise BenchServeError(f"--concurrency must be >= 1, got {concurrency}")
    rng = random.Random(seed + 1)
    results: list[RequestResult] = []
    lock = threading.Lock()
    run_start = time.perf_counter()

    def one(request: BenchRequest) -> None:
        result = send_streaming(url, request, timeout, run_start)
        with lock:
            results.append(result)
        if on_done is not None:
            on_done(result)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = []
        for request in requests:
            futures.append(pool.submit(one, request))
            if math.isfinite(request_rate):
                time.sleep(rng.expovariate(request_rate))
        for future in futures:
            future.result()
    wall = time.perf_counter() - run_start
    return sorted(results, key=lambda r: r.index), wall


def summarize(results: list[RequestResult], wall: float) -> Summary:
    ok = [r for r in results if r.ok]
    input_tokens = sum(r.input_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    wall = max(wall, 1e-9)
    return Summary(
        num_requests=len(results),
        num_failed=len(results) - len(ok),
        wall_seconds=wall,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_throughput=len(ok) / wall,
        input_throughput=input_tokens / wall,
        output_throughput=output_tokens / wall,
        total_throughput=(input_tokens + output_tokens) / wall,
        ttft=Stats.of([r.ttft for r in ok if r.ttft is not None]),
        latency=Stats.of([r.latency for r in ok if r.latency is not None]),
        time_per_output_token=Stats.of(
            [t for r in ok if (t := r.time_per_output_token) is not None]
        ),
        errors=sorted({r.error for r in results if r.error})[:10],
    )


def server_info(url: str, timeout: float) -> dict[str, Any]:
    """The few server facts worth recording next to the numbers (best effort)."""
    try:
        conn, prefix = connection(url, timeout)
        conn.request("GET", prefix + "/server_info")
        info = json.loads(conn.getresponse().read())
        conn.close()
    except Exception as exc:  # noqa: BLE001 - not every server exposes /server_info
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    args = info.get("server_args", info) if isinstance(info, dict) else {}
    keys = ("model_path", "pp_mode", "pp_size", "tp_size", "chunked_prefill_size", "enable_dynamic_chunking",
            "max_prefill_tokens", "device", "attention_backend", "dtype")  # fmt: skip
    return {key: args.get(key) for key in keys if key in args}
