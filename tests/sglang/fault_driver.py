"""Drive faults into a real pipeline server: find its rank processes, load it, signal a rank.

A ``FaultRun`` owns one healthy server that the fault will end, a background client request that
puts the pipeline in the wanted phase, and the bookkeeping the assertions need (when the signal
went out, when the launcher was gone, every process seen). ``assert_fault_ends_the_server`` is the
one check every fault case makes: test_faults.py on a server of its own, every other case on the
last use of a shared server (kill -9 in test_guard_and_load.py and test_server_generate.py, SIGSTOP
in test_server_generate.py and tests/sglang_vpp/test_vpp_server.py, whose servers for it start
with ``STOP_COMM_TIMEOUT_S``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psutil

__all__ = ["KILL_BOUND_S", "STOP_BOUND_EXTRA_S", "STOP_BOUND_S", "STOP_COMM_TIMEOUT_S", "FaultRun",
           "assert_fault_ends_the_server", "rank_pids"]

KILL_BOUND_S = 15.0
"""kill -9 of a rank is seen at once (its sockets close): the whole server is gone within this."""
STOP_BOUND_EXTRA_S = 10.0
"""A stopped (SIGSTOP) rank: gone within --vpp-comm-timeout plus this."""
STOP_COMM_TIMEOUT_S = 5.0
"""``--vpp-comm-timeout`` of a server that a SIGSTOP case ends (kill -9 is seen at once with any
timeout). The tests that use such a server first stay clear of it: the stock loop's watchdog fires
only when a rank is stopped, dead or gone, or no rank used CPU in the window, and a VPP wait (one
micro-batch of a tiny model, or the 1 s idle heartbeat) lasts far less."""
STOP_BOUND_S = STOP_COMM_TIMEOUT_S + STOP_BOUND_EXTRA_S


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """pp rank -> pid of the scheduler processes under ``launcher_pid`` (tp rank 0)."""
    out = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "sglang::scheduler" in title:
            tags = title.split("sglang::scheduler", 1)[1].split()[0]
            pp = int(tags.split("_PP", 1)[1].split("_")[0]) if "_PP" in tags else 0
            if "_TP" not in tags or tags.endswith("_TP0") or "_TP0_" in tags:
                out[pp] = child.pid
    return out


@dataclass
class FaultRun:
    """One fault against one server (``SGLangServer``, already healthy)."""

    server: Any
    client_result: dict[str, Any] = field(default_factory=dict)
    signalled_at: float = 0.0
    gone_after_s: float | None = None
    _client: threading.Thread | None = None
    _seen: list[psutil.Process] = field(default_factory=list)

    def __post_init__(self) -> None:
        root = psutil.Process(self.server.process.pid)
        self._seen = [root, *root.children(recursive=True)]

    def start_load(self, phase: str, prompt_len: int = 2500, new_tokens: int = 400) -> None:
        """A streamed request; returns once the pipeline is in ``phase`` (prefill/decode/idle)."""
        if phase == "idle":
            return
        first_token = threading.Event()
        payload = {
            "input_ids": [(7 * i) % 11000 + 3 for i in range(prompt_len if phase == "prefill" else 40)],
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
            "stream": True,
        }

        def client() -> None:
            request = urllib.request.Request(
                self.server.url + "/generate", data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            chunks: list[str] = []
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    self.client_result["status"] = response.status
                    for line in response:
                        chunks.append(line.decode(errors="replace"))
                        first_token.set()
                self.client_result["outcome"] = "completed"
            except urllib.error.HTTPError as exc:
                self.client_result.update(status=exc.code, outcome="http-error")
            except Exception as exc:  # noqa: BLE001 - the outcome is what the test records
                self.client_result["outcome"] = f"{type(exc).__name__}"
            self.client_result["body_tail"] = "".join(chunks)[-500:]
            first_token.set()

        self._client = threading.Thread(target=client, daemon=True)
        self._client.start()
        if phase == "decode":
            assert first_token.wait(120), "no token streamed within 120 s"
        else:
            time.sleep(0.5)  # the prompt is ~40 chunks: prefill is still running

    def signal_rank(self, pp_rank: int, sig: int) -> int:
        pid = rank_pids(self.server.process.pid)[pp_rank]
        self.signalled_at = time.monotonic()
        os.kill(pid, sig)
        return pid

    def wait_gone(self, limit_s: float) -> float | None:
        """Seconds from the signal until the launcher exited; None if it outlived ``limit_s``."""
        try:
            self.server.process.wait(timeout=max(0.0, self.signalled_at + limit_s - time.monotonic()))
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            return None
        self.gone_after_s = time.monotonic() - self.signalled_at
        return self.gone_after_s

    def leftovers(self, settle_s: float = 5.0) -> list[str]:
        """Processes of this server still alive after ``settle_s`` seconds."""
        deadline = time.monotonic() + settle_s
        alive = self._alive()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self._alive()
        return [f"{p.pid} {p.name()}" for p in alive]

    def _alive(self) -> list[psutil.Process]:
        out = []
        for process in self._seen:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    out.append(process)
            except psutil.Error:
                pass
        return out

    def join_client(self, timeout: float = 30.0) -> dict[str, Any]:
        if self._client is not None:
            self._client.join(timeout)
        return self.client_result


def assert_fault_ends_the_server(server: Any, name: str, sig: int, rank: int, phase: str, bound_s: float) -> None:
    """Put ``server`` (healthy; the fault ends it) in ``phase``, send ``sig`` to pipeline rank
    ``rank`` and assert: the launcher is gone within ``bound_s``, no process of the server is left,
    and its log names the failed rank (pp rank, tp rank, node, pid, signal or state) in one line."""
    run = FaultRun(server)
    run.start_load(phase)
    pid = run.signal_rank(rank, sig)
    gone = run.wait_gone(bound_s)
    log = server.log_path.read_text(errors="replace")
    what = signal.Signals(sig).name
    assert gone is not None, f"server still up {bound_s} s after {what} of rank {rank}:\n{log[-4000:]}"
    assert run.leftovers() == [], log[-4000:]
    lines = [line for line in log.splitlines() if "sglang-vpp: pipeline rank failed" in line]
    how = "killed by signal 9 (SIGKILL)" if sig == signal.SIGKILL else "is stopped"
    named = [line for line in lines if re.search(re.escape(f"pp_rank={rank} tp_rank=0 node=0 pid={pid} {how}"), line)]
    assert len(named) == 1, f"expected one line naming pp_rank={rank} pid={pid}:\n{log[-4000:]}"
    # a survivor (it saw its peer die and ended itself) is never reported as a failure
    assert len(lines) == 1, f"ranks other than pp_rank={rank} reported as failed:\n{log[-4000:]}"
    print(f"{name}: gone after {gone:.1f} s; client: {run.join_client()}")
