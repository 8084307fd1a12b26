"""A rank that dies or hangs takes the server down fast, says which rank and how, leaves nothing.

Each case starts a fresh server (pp 2; one case pp 4) (the fault ends it), puts the pipeline in a phase with a
streamed request, signals one rank and asserts: the launcher is gone within the bound, its log
names the failed rank (pp rank, tp rank, node, pid, signal or state) in one line, and no process
of the server is left. SIGSTOP cases run with ``--vpp-comm-timeout 5`` (bound: timeout + 10 s), kill -9 cases with
a long timeout (the death is seen at once; bound 15 s);
stock cpp is covered through the plugin's watchdog on the stock loop. Not every rank x phase x
mode product runs (each case costs a server start); the cases below cover both ranks, the three
phases and both modes between them.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from fault_driver import FaultRun
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, SGLangServer

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

COMM_TIMEOUT_S = 5.0
STOP_BOUND_S = COMM_TIMEOUT_S + 10.0
KILL_BOUND_S = 15.0
KILL_CASE_TIMEOUT_S = 120.0

# (case id, mode, pp size, signal, pp rank, phase)
CASES = [
    ("vpp-pack-sigstop-rank1-decode", "vpp-pack", 2, signal.SIGSTOP, 1, "decode"),
    ("cpp-sigstop-rank0-prefill", "cpp", 2, signal.SIGSTOP, 0, "prefill"),
    ("vpp-pack-kill-rank0-prefill", "vpp-pack", 2, signal.SIGKILL, 0, "prefill"),
    ("cpp-kill-rank1-idle", "cpp", 2, signal.SIGKILL, 1, "idle"),
    ("cpp-pp4-kill-rank2-decode", "cpp", 4, signal.SIGKILL, 2, "decode"),
]  # fmt: skip


@pytest.mark.parametrize("name,mode,pp_size,sig,rank,phase", CASES, ids=[c[0] for c in CASES])
def test_rank_fault_ends_the_server_and_names_the_rank(
    tiny_model_dir: Path, tmp_path: Path, name, mode, pp_size, sig, rank, phase
):
    config = ServerConfig(
        model_dir=str(tiny_model_dir), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=64,
        # kill -9 is seen at once; a long timeout there keeps slow start-ups from counting as stuck
        extra_args=("--vpp-comm-timeout", str(COMM_TIMEOUT_S if sig == signal.SIGSTOP else KILL_CASE_TIMEOUT_S)),
    )  # fmt: skip
    server = SGLangServer(config, tmp_path / f"{name}.log").start(timeout=400)
    try:
        run = FaultRun(server)
        run.start_load(phase)
        pid = run.signal_rank(rank, sig)
        bound = STOP_BOUND_S if sig == signal.SIGSTOP else KILL_BOUND_S
        gone = run.wait_gone(bound)
        log = server.log_path.read_text(errors="replace")
        assert gone is not None, f"server still up {bound} s after {sig.name} of rank {rank}:\n{log[-4000:]}"
        assert run.leftovers() == [], log[-4000:]
        lines = [line for line in log.splitlines() if "sglang-vpp: pipeline rank failed" in line]
        how = "killed by signal 9 (SIGKILL)" if sig == signal.SIGKILL else "is stopped"
        named = [line for line in lines if re.search(re.escape(f"pp_rank={rank} tp_rank=0 node=0 pid={pid} {how}"), line)]
        assert len(named) == 1, f"expected one line naming pp_rank={rank} pid={pid}:\n{log[-4000:]}"
        print(f"{name}: gone after {gone:.1f} s; client: {run.join_client()}")
    finally:
        server.stop()
