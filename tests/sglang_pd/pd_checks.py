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
from typing import Protocol, Sequence

from sglang_harness import ServerConfig, assert_kv_idle, post_json
from vpp_checks import make_prompts

from sglang_vpp.serving.launcher import free_port
from sglang_vpp.serving.pd_launcher import PdDeployment, prefill_config

CHUNK = 64
"""``--chunked-prefill-size`` of every PD server of the tests."""
PROMPT_LENGTHS = (300, 200, 150, 130)
"""The four concurrent prompts (3 to 5 chunks of 64; the last one sent while the others are in
prefill) that every prefill mode serves through the router."""
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
"""Mooncake's four TCP transfer bounds (docs/pd.md names each and its default) at 180 s, for the
prefill servers of the TP x PP, PP-4 and DeepSeek tests (test_pd_vpp_configs.py), which check
tokens, not transfer latency: on the loaded 2-core host every rank's send of such a prefill has
stalled past the defaults together. Not for the fault tests, whose error bounds may rest on
Mooncake's."""
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
EVIDENCE_LINE_CHARS = 300
"""Each such line cut to this: SGLang's one-line dump of its server arguments names many timeouts."""


class Logged(Protocol):
    """A launch whose log the evidence reads (a server, the router, another node's launch)."""

    def log_tail(self, num_chars: int) -> str: ...


def server_evidence(deployment: PdDeployment | None, max_lines: int = 40, tail_chars: int = 2000,
                    extra: Sequence[tuple[str, Logged]] = ()) -> str:
    """The last ``max_lines`` log lines matching ``TROUBLE`` and the log tail of the prefill and
    decode servers, the router, and each (role, process with ``log_tail``) of ``extra`` (a second
    node's launch): the prefill's cause of a failed request may lie far above its tail (every rank
    of a launch logs to one file), and the decode server's error may name none (docs/pd.md)."""
    if deployment is None:
        return ""
    parts = []
    roles = (("prefill", deployment.prefill), ("decode", deployment.decode),
             ("router", deployment.router), *extra)
    for role, server in roles:
        if server is None:
            continue
        log = server.log_tail(10_000_000)
        trouble = [line[:EVIDENCE_LINE_CHARS] for line in log.splitlines() if TROUBLE.search(line)][-max_lines:]
        parts.append(f"{role} log, lines naming trouble:\n" + "\n".join(trouble)
                     + f"\n{role} log tail:\n{log[-tail_chars:]}")
    return "\n".join(parts)


PREFILL_FAILED_NO_REASON = "Failed to get kvcache from prefill instance"
"""The decode server's error when a prefill rank reports its room failed without a reason
(SGLang's ``CommonKVManager.DEFAULT_PREFILL_FAILURE_REASON``): what every failure on the prefill
side reads as over Mooncake, a stalled KV send as well as the plugin's own refusals."""
KV_IDLE_AFTER_FAILURE_S = 240.0
"""A failed room's KV is freed once every pipeline rank's send of it has ended: within the
patient transfer bounds (180 s, ``PATIENT_TRANSFER_ENV``) and a margin."""
RESEND_PAUSE_S = 35.0
"""Before the prompts are sent again: the prefill bars a Mooncake session whose send failed until
its probe reaches the decode server again, the first probe within SGLang's
``SGLANG_FAILED_SESSION_PROBE_INTERVAL_S`` (30 s by default)."""


class TransferRetryWarning(UserWarning):
    """The prompts were sent again after a prefill-side failure (``four_prompts``)."""


def _send_four(url: str, prompts: list[list[int]]) -> tuple[list, dict[int, BaseException]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        early = [pool.submit(generate, url, ids) for ids in prompts[:-1]]
        time.sleep(LATE_DELAY_S)
        late = pool.submit(generate, url, prompts[-1])
        futures = early + [late]
        failures = {i: future.exception() for i, future in enumerate(futures) if future.exception() is not None}
    return [None if i in failures else future.result() for i, future in enumerate(futures)], failures


def four_prompts(url: str, prompts: list[list[int]], deployment: PdDeployment | None = None,
                 resends: int = 0, extra: Sequence[tuple[str, Logged]] = ()) -> list[list[int]]:
    """The prompts concurrently through ``url``; the last one sent while the others are in prefill.
    A failed request fails the test, naming every failed prompt, the first one's error and, given
    ``deployment``, the servers' evidence. Up to ``resends`` times, when every failure reads
    ``PREFILL_FAILED_NO_REASON``, KV must come back to 0 on both sides and the four prompts are
    sent again the same way, with a ``TransferRetryWarning`` carrying the evidence: for tests of
    tokens on a host where Mooncake's TCP sends have stalled (docs/pd.md). A failure that the
    four prompts bring about each time still fails the test. ``extra``: more logs for the
    evidence (``server_evidence``)."""
    if resends and deployment is None:
        raise ValueError("sending the prompts again needs the deployment, to see KV back to 0 first")
    attempt = 0
    while True:
        answers, failures = _send_four(url, prompts)
        if not failures:
            return answers
        first, exc = min(failures.items())
        report = (f"prompts {sorted(failures)} of {len(prompts)} failed (try {attempt + 1} of {resends + 1}); "
                  f"prompt {first} with {exc!r}")
        if attempt == resends or any(PREFILL_FAILED_NO_REASON not in str(e) for e in failures.values()):
            raise AssertionError(f"{report}\n{server_evidence(deployment, extra=extra)}") from exc
        warnings.warn(TransferRetryWarning(f"{report}; sending the prompts again\n"
                                           f"{server_evidence(deployment, extra=extra)}"),
                      stacklevel=2)
        assert_kv_idle(deployment.prefill, deployment.decode, bound_s=KV_IDLE_AFTER_FAILURE_S,
                       what="after a prefill-side failure: ")
        time.sleep(RESEND_PAUSE_S)
        attempt += 1


def check(deployment: PdDeployment, label: str, got: list[list[int]], want: list[list[int]],
          extra: Sequence[tuple[str, Logged]] = ()) -> None:
    """Every answer equals ``want``, then KV back to 0 on both sides; ``extra``: as ``server_evidence``'s."""
    for ids, answer, expected in zip(PROMPT_LENGTHS, got, want):
        assert answer == expected, (f"{label}, prompt of {ids} tokens: {answer} != {expected}\n"
                                    f"{server_evidence(deployment, extra=extra)}")
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
