"""Soak a pipeline server: N minutes of mixed traffic with random aborts and bad inputs.

Not part of CI. Starts one server (tiny Qwen2 built locally; ``--mode vpp-pack`` by default,
any ``--pp-mode`` works), keeps ``--concurrency`` clients busy for ``--minutes``, then drains
and reports:

- requests served, and every other ending by kind (aborted on request, refused with 400,
  other HTTP status, client-side exception);
- KV tokens in use (``/v1/loads``, summed over ranks): peak during the run, final after drain;
- resident memory (RSS) of each rank process over time, sampled every ``--sample-s`` seconds.

Traffic per request: prompt 20..``--max-prompt`` tokens, 4..48 new tokens, 1 in 4 streamed,
1 in 10 aborted through ``/abort_request`` after a random delay, 1 in 20 a bad input (empty
prompt, id out of range, -1) that must be refused with 400. Seeded (``--seed``).

    python benchmarks/soak.py --minutes 3 --out benchmarks/results/soak

Writes OUT.json (samples and totals) and OUT.md (summary table), and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from sglang_vpp.models.tiny_hf import TinyModelSpec, build_tiny_model
from sglang_vpp.serving.launcher import ServerConfig, SGLangServer

VOCAB = 12000
BAD_INPUTS = ({"text": ""}, {"input_ids": [VOCAB]}, {"input_ids": [-1, 5]}, {"input_ids": [[3, 4], [VOCAB + 7]]})


def _post(url: str, payload: dict[str, Any], timeout: float = 300.0) -> tuple[int, str]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _finish_type(body: str, streamed: bool) -> str:
    text = [line for line in body.splitlines() if line.startswith("data: {")][-1][6:] if streamed else body
    reply = json.loads(text)
    reply = reply[0] if isinstance(reply, list) else reply
    return (reply["meta_info"]["finish_reason"] or {}).get("type", "none")


def one_request(url: str, rng: random.Random, index: int, max_prompt: int) -> str:
    """Send one request of the mix; return its ending's kind."""
    roll = rng.random()
    if roll < 0.05:
        status, body = _post(url + "/generate", dict(rng.choice(BAD_INPUTS)))
        return "refused-400" if status == 400 else f"bad-input-answered-{status}"
    streamed = rng.random() < 0.25
    payload = {
        "input_ids": [rng.randrange(2, VOCAB) for _ in range(rng.randrange(20, max_prompt + 1))],
        "rid": f"soak-{index}",
        "sampling_params": {"temperature": 0, "max_new_tokens": rng.randrange(4, 49), "ignore_eos": True},
        "stream": streamed,
    }
    abort = roll < 0.15
    if abort:
        timer = threading.Timer(rng.uniform(0.05, 2.0), _post, args=(url + "/abort_request", {"rid": payload["rid"]}))
        timer.daemon = True
        timer.start()
    try:
        status, body = _post(url + "/generate", payload)
    except Exception as exc:  # noqa: BLE001 - counted by kind
        return f"exception-{type(exc).__name__}"
    if status != 200:
        return f"http-{status}"
    finish = _finish_type(body, streamed)
    if finish == "abort":
        return "aborted" if abort else "aborted-unasked"
    return "served" if finish == "length" else f"finished-{finish}"


def kv_tokens_in_use(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/loads?include=core", timeout=30) as response:
        return sum(int(load["num_used_tokens"]) for load in json.loads(response.read())["loads"])


def rank_rss_mib(launcher_pid: int) -> dict[str, float]:
    out = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
            if "sglang::scheduler" in title:
                out[title.split("sglang::")[1].split()[0]] = child.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return out


def soak(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = build_tiny_model(Path(tempfile.mkdtemp(prefix="soak-model-")), TinyModelSpec("qwen2-tiny"))
    config = ServerConfig(model_dir=str(model_dir), pp_size=args.pp_size, pp_mode=args.mode, chunked_prefill_size=64)
    server = SGLangServer(config, Path(args.out).with_suffix(".server.log")).start(timeout=600)
    outcomes: Counter[str] = Counter()
    samples: list[dict[str, Any]] = []
    lock = threading.Lock()
    began = time.monotonic()
    stop_at = began + args.minutes * 60

    def client(worker: int) -> None:
        rng = random.Random(args.seed * 1000 + worker)
        index = worker
        while time.monotonic() < stop_at:
            kind = one_request(server.url, rng, index, args.max_prompt)
            with lock:
                outcomes[kind] += 1
            index += args.concurrency

    try:
        workers = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(args.concurrency)]
        for worker in workers:
            worker.start()
        while any(worker.is_alive() for worker in workers):
            samples.append({"t_s": round(time.monotonic() - began, 1), "kv_tokens": kv_tokens_in_use(server.url),
                            "rss_mib": rank_rss_mib(server.process.pid)})
            time.sleep(args.sample_s)
        deadline = time.monotonic() + 60
        final_kv = kv_tokens_in_use(server.url)
        while final_kv and time.monotonic() < deadline:
            time.sleep(1)
            final_kv = kv_tokens_in_use(server.url)
        final_rss = rank_rss_mib(server.process.pid)
        alive = server.process.poll() is None
    finally:
        server.stop()
    return {
        "config": {"mode": args.mode, "pp_size": args.pp_size, "minutes": args.minutes,
                   "concurrency": args.concurrency, "max_prompt": args.max_prompt, "seed": args.seed},
        "outcomes": dict(sorted(outcomes.items())),
        "server_alive_at_end": alive,
        "kv_tokens": {"peak": max((s["kv_tokens"] for s in samples), default=0), "final": final_kv},
        "rss_mib": {"first": samples[0]["rss_mib"] if samples else {}, "final": final_rss},
        "samples": samples,
    }  # fmt: skip


def render(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [
        f"Soak: --pp-mode {c['mode']} --pp-size {c['pp_size']}, {c['minutes']} min, {c['concurrency']} clients, "
        f"prompts 20..{c['max_prompt']} tokens, seed {c['seed']}; server alive at the end: {report['server_alive_at_end']}.",
        "",
        "| ending | count |",
        "|---|---|",
        *[f"| {kind} | {count} |" for kind, count in report["outcomes"].items()],
        "",
        f"KV tokens in use: peak {report['kv_tokens']['peak']}, final {report['kv_tokens']['final']}.",
        "",
        "| rank process | RSS MiB first sample | RSS MiB final |",
        "|---|---|---|",
        *[f"| {name} | {report['rss_mib']['first'].get(name, float('nan')):.0f} | {rss:.0f} |"
          for name, rss in sorted(report["rss_mib"]["final"].items())],
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--mode", default="vpp-pack")
    parser.add_argument("--pp-size", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=1500)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/soak")
    args = parser.parse_args()
    report = soak(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    table = render(report)
    out.with_suffix(".md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
