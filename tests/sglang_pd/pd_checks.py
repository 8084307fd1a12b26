"""Helpers of the PD tests (test_pd_vpp.py, test_pd_vpp_configs.py, test_pd_router.py): a prefill
server behind the router, the four concurrent prompts through it, the checks on what came back,
and the count of prefill batches a launch has logged (to act while a prompt is in prefill)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import CHUNK, PROMPT_LENGTHS
from sglang_harness import ServerConfig, assert_kv_idle, post_json
from vpp_checks import make_prompts

from sglang_vpp.serving.launcher import free_port
from sglang_vpp.serving.pd_launcher import PdDeployment, prefill_config

LATE_DELAY_S = 1.0
NUM_NEW = 8
LONG_PROMPT = 3000
"""Tokens of a prompt still in prefill (47 chunks of 64, its KV on its way) when a fault or an
abort comes."""
ERROR_BOUND_S = 60.0
"""An aborted or failed request's client has its error within this (the tests' router runs with
``--disable-retries``)."""
MIXED_LENGTHS = (5, 37, 64, 130, 200, 90, 20, 150)
"""1 to 4 chunks of 64 each (``NUM_MIXED`` requests, about 2,800 prompt tokens in all)."""
NUM_MIXED = 32
PATIENT_TRANSFER_ENV = (("MC_TRANSFER_TIMEOUT", "180"), ("MC_TCP_PROGRESS_TIMEOUT_SEC", "180"),
                        ("MC_TCP_STATUS_TIMEOUT_SEC", "180"), ("MC_TCP_ADMISSION_TIMEOUT_MS", "180000"))
"""Mooncake's TCP bounds at 180 s, for the servers of a test that checks tokens, not transfer
latency: a synchronous KV send (``MC_TRANSFER_TIMEOUT``, 30 s by default), a TCP session without
progress (``MC_TCP_PROGRESS_TIMEOUT_SEC``, 30 s) or without its status frame
(``MC_TCP_STATUS_TIMEOUT_SEC``, 30 s), and the wait of a transfer for a free connection lane to its
peer (``MC_TCP_ADMISSION_TIMEOUT_MS``, 1 s). On the loaded 2-core host every rank's send of a
TP x PP or PP-4 prefill has stalled past 30 s together (docs/pd.md), and a request has failed within
seconds with no cause named, failing requests whose answers were right. Not for the fault tests,
whose error bounds may rest on Mooncake's."""
PREFILL_BATCH_LINE = "Prefill batch"
"""SGLang logs one such line per prefill batch run on each pipeline rank of a launch."""


def prefill_of(model_dir: Path, mode: str, extra: tuple[str, ...] = (), pp_size: int = 2,
               extra_env: tuple[tuple[str, str], ...] = ()) -> ServerConfig:
    """The config of a prefill server of ``mode`` (equal configs: ``serve`` keeps the running one)."""
    base = ServerConfig(model_dir=str(model_dir), chunked_prefill_size=CHUNK, pp_size=pp_size, pp_mode=mode,
                        extra_args=extra, extra_env=extra_env)
    return prefill_config(base, bootstrap_port=free_port())


def serve(deployment: PdDeployment, model_dir: Path, mode: str, extra: tuple[str, ...] = (), pp_size: int = 2,
          extra_env: tuple[tuple[str, str], ...] = ()):
    """``deployment``'s router in front of a fresh prefill server of ``mode``."""
    return deployment.serve_prefill(prefill_of(model_dir, mode, extra, pp_size, extra_env))


def generate(url: str, ids: list[int]) -> list[int]:
    answer = post_json(url + "/generate", {
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NUM_NEW, "ignore_eos": True},
    }, timeout=600)  # fmt: skip
    return answer["output_ids"]


def post_status(url: str, payload: dict, timeout: float) -> tuple[int, str]:
    """POST JSON; the HTTP status and the body, errors included."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


TROUBLE = re.compile(r"error|fail|timeout|timed out|not alive|dead|traceback", re.IGNORECASE)
"""Log lines worth showing when a request fails: Mooncake's and SGLang's transfer errors."""


def server_evidence(deployment: PdDeployment, lines: int = 40, tail_chars: int = 2000) -> str:
    """The prefill and decode servers' last ``lines`` log lines matching ``TROUBLE`` and their log
    tails: the decode server's error names no cause (Mooncake's status carries none), and the
    prefill's cause may lie far above its tail (every rank of a launch logs to one file)."""
    parts = []
    for role, server in (("prefill", deployment.prefill), ("decode", deployment.decode)):
        if server is None:
            continue
        log = server.log_tail(10_000_000)
        trouble = [line for line in log.splitlines() if TROUBLE.search(line)][-lines:]
        parts.append(f"{role} log, lines naming trouble:\n" + "\n".join(trouble)
                     + f"\n{role} log tail:\n{log[-tail_chars:]}")
    return "\n".join(parts)


MOONCAKE_TRANSFER_FAILED = "Failed to get kvcache from prefill instance"
"""The decode server's error when a prefill rank reports a failed KV transfer (Mooncake's status
message carries no cause: ``server_evidence`` looks for it in the logs)."""
TRANSFER_RETRY_PAUSE_S = 10.0
"""Between tries of a prompt whose KV transfer failed: the prefill bars a failed Mooncake session
until its probe (every 30 s) reaches the decode server again."""


def four_prompts(url: str, prompts: list[list[int]], deployment: PdDeployment | None = None,
                 transfer_retry_s: float = 0.0) -> list[list[int]]:
    """The prompts concurrently through ``url``; the last one sent while the others are in prefill.
    A failed request names its error and, given ``deployment``, the servers' evidence. With
    ``transfer_retry_s``, a prompt failed by a KV transfer alone (``MOONCAKE_TRANSFER_FAILED``) is
    sent again, with a warning that shows the evidence, until it is answered or that long has
    passed: for tests of tokens on a host where Mooncake's TCP sends have stalled (docs/pd.md)."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        early = [pool.submit(generate, url, ids) for ids in prompts[:-1]]
        time.sleep(LATE_DELAY_S)
        late = pool.submit(generate, url, prompts[-1])
        futures = early + [late]
        failures = {i: future.exception() for i, future in enumerate(futures) if future.exception() is not None}
    answers = [None if i in failures else future.result() for i, future in enumerate(futures)]
    for i, exc in failures.items():
        if transfer_retry_s <= 0 or MOONCAKE_TRANSFER_FAILED not in str(exc):
            evidence = server_evidence(deployment) if deployment is not None else ""
            raise AssertionError(f"prompts {sorted(failures)} of {len(prompts)} failed; prompt {i} with "
                                 f"{exc!r}\n{evidence}") from exc
        answers[i] = _after_transfer_failure(url, prompts[i], exc, deployment, transfer_retry_s)
    return answers


def _after_transfer_failure(url: str, ids: list[int], exc: BaseException, deployment: PdDeployment | None,
                            retry_s: float) -> list[int]:
    evidence = server_evidence(deployment) if deployment is not None else ""
    warnings.warn(f"a prompt of {len(ids)} tokens failed by its KV transfer alone ({exc}); sending it again "
                  f"for up to {retry_s:.0f} s\n{evidence}", stacklevel=3)
    deadline = time.monotonic() + retry_s
    while True:
        time.sleep(TRANSFER_RETRY_PAUSE_S)
        try:
            return generate(url, ids)
        except RuntimeError as again:
            if MOONCAKE_TRANSFER_FAILED not in str(again) or time.monotonic() > deadline:
                evidence = server_evidence(deployment) if deployment is not None else ""
                raise AssertionError(f"a prompt of {len(ids)} tokens failed again: {again!r}\n{evidence}") from again


def check(deployment: PdDeployment, label: str, got: list[list[int]], want: list[list[int]]) -> None:
    """Every answer equals ``want``, then KV back to 0 on both sides."""
    for ids, answer, expected in zip(PROMPT_LENGTHS, got, want):
        assert answer == expected, (
            f"{label}, prompt of {ids} tokens: {answer} != {expected}; prefill log tail:\n"
            f"{deployment.prefill.log_tail(3000)}\ndecode log tail:\n{deployment.decode.log_tail(2000)}"
        )
    assert_kv_idle(deployment.prefill, deployment.decode, what=f"{label}: ")


def check_mixed(deployment: PdDeployment, url: str, greedy) -> None:
    """``NUM_MIXED`` requests of ``MIXED_LENGTHS`` at once through ``url``: each answer equals
    ``greedy(ids)`` (transformers' continuation), then KV back to 0 on both sides."""
    prompts = make_prompts([MIXED_LENGTHS[i % len(MIXED_LENGTHS)] for i in range(NUM_MIXED)], 32)
    with ThreadPoolExecutor(NUM_MIXED) as pool:
        answers = list(pool.map(lambda ids: generate(url, ids), prompts))
    wrong = [(len(ids), a, greedy(ids)) for ids, a in zip(prompts, answers) if a != greedy(ids)]
    assert not wrong, f"{len(wrong)} of {NUM_MIXED} differ from transformers, e.g. {wrong[:2]}"
    assert_kv_idle(deployment.prefill, deployment.decode)


def prefill_batches_logged(log_path: Path, ranks: int) -> int:
    """Prefill batches a launch has run so far, from its log (one line per batch from each of
    the launch's ``ranks`` pipeline ranks)."""
    return log_path.read_text(errors="replace").count(PREFILL_BATCH_LINE) // ranks


def wait_in_prefill(log_path: Path, ranks: int, logged_before: int, client=None) -> None:
    """Return once the launch has logged a prefill batch since ``logged_before``: a long prompt
    (alone on the server) is in chunked prefill, its KV being sent. ``client`` (a future) must
    not have returned before."""
    deadline = time.monotonic() + ERROR_BOUND_S
    while prefill_batches_logged(log_path, ranks) <= logged_before:
        assert client is None or not client.done(), f"the client returned before any prefill: {client.result()}"
        assert time.monotonic() < deadline, f"no prefill batch within {ERROR_BOUND_S:.0f} s"
        time.sleep(0.05)
