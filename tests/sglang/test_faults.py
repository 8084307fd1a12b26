"""A rank that dies or hangs takes the server down fast, says which rank and how, leaves nothing.

Each case puts the pipeline in a phase with a streamed request, signals one rank and asserts
(``fault_driver.assert_fault_ends_the_server``): the launcher is gone within the bound, its log
names the failed rank (pp rank, tp rank, node, pid, signal or state) in one line, and no process of
the server is left. SIGSTOP cases run with ``--vpp-comm-timeout 5`` (bound: timeout + 10 s); kill -9
is seen at once (bound 15 s) with any timeout. A fault ends its server, so every case but the one
here ends the last use of a shared server instead of starting one: kill -9 of vpp-pack rank 0 in
prefill (test_guard_and_load.py), kill -9 of cpp rank 1 idle and SIGSTOP of dcpp rank 0 in prefill
(test_server_generate.py), SIGSTOP of vpp-pack rank 1 in decode (tests/sglang_vpp/test_vpp_server.py).
The case here, stock cpp at pp 4 (kill -9 of rank 2, a middle rank, in decode), has no server to
end: no other test starts cpp at pp 4. Stock cpp and dcpp are covered through the plugin's watchdog
on the stock loop. Not every rank x phase x mode product runs (each case costs a server start); the
cases cover both ends of the pipeline and a middle rank, the three phases and both loops between them.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from fault_driver import KILL_BOUND_S, STOP_BOUND_S, STOP_COMM_TIMEOUT_S, assert_fault_ends_the_server
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, SGLangServer

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

KILL_CASE_TIMEOUT_S = 120.0

# (case id, mode, pp size, signal, pp rank, phase)
CASES = [
    ("cpp-pp4-kill-rank2-decode", "cpp", 4, signal.SIGKILL, 2, "decode"),
]  # fmt: skip


@pytest.mark.parametrize("name,mode,pp_size,sig,rank,phase", CASES, ids=[c[0] for c in CASES])
def test_rank_fault_ends_the_server_and_names_the_rank(
    tiny_model_dir: Path, tmp_path: Path, name, mode, pp_size, sig, rank, phase
):
    config = ServerConfig(
        model_dir=str(tiny_model_dir), pp_size=pp_size, pp_mode=mode, chunked_prefill_size=64,
        # kill -9 is seen at once; a long timeout there keeps slow start-ups from counting as stuck
        extra_args=("--vpp-comm-timeout", str(STOP_COMM_TIMEOUT_S if sig == signal.SIGSTOP else KILL_CASE_TIMEOUT_S)),
    )  # fmt: skip
    server = SGLangServer(config, tmp_path / f"{name}.log").start(timeout=400)
    try:
        bound = STOP_BOUND_S if sig == signal.SIGSTOP else KILL_BOUND_S
        assert_fault_ends_the_server(server, name, sig, rank, phase, bound)
    finally:
        server.stop()
