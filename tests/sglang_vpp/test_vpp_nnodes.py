"""Several nodes: two launches on this machine (``--nnodes 2 --node-rank 0|1``), one per node,
joined only through SGLang's own distributed set-up (``--dist-init-addr``).

``--pp-size 2``: node 0 holds virtual stages 0 and 3 (and serves HTTP), node 1 stages 1 and 2;
the start-up log of each node says so. Cases: stock cpp, vpp-pack (equal to cpp's tokens), and
TP2 x PP2 over the two nodes (each node one pipeline stage of two TP ranks) with vpp-async.
Oracle: transformers' greedy tokens and prompt logprobs (within 1e-4). Each case kills both
launches' process trees.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from sglang_harness import SKIP_NO_SGLANG, ServerConfig, SGLangServer, ServerStartError, free_port
from vpp_checks import CHUNK, QWEN2_8L, Reference, greedy_tokens_checked

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

CASES = {"cpp": ("cpp", 1), "vpp-pack": ("vpp-pack", 1), "tp2-vpp-async": ("vpp-async", 2)}
LENGTHS = (300, 37, 200)
_CPP_TOKENS: list[list[int]] = []


class NodeLaunch(SGLangServer):
    """A launch with ``--node-rank >= 1``: it runs scheduler processes only and serves no HTTP,
    so "started" means "still running"; the node-0 launch's health covers both."""

    def _wait_healthy(self, deadline: float, on_wait=None) -> None:
        assert self.process is not None
        time.sleep(2.0)
        self._remember_descendants(self.process.pid)
        if self.process.poll() is not None:
            raise ServerStartError(f"node launch exited with {self.process.returncode}; log tail:\n{self.log_tail()}")


@pytest.fixture(scope="module")
def reference(tiny_model) -> Reference:
    return Reference(tiny_model)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def nodes(request, server_pool, tiny_model, tmp_path_factory) -> Iterator[tuple[SGLangServer, SGLangServer]]:
    server_pool.close()  # the two launches below are the only servers while this case runs
    mode, tp_size = CASES[request.param]
    log_dir = tmp_path_factory.mktemp(f"nnodes-{request.param}")
    init_addr = f"127.0.0.1:{free_port()}"
    base = ServerConfig(
        model_dir=str(tiny_model(QWEN2_8L)), pp_size=2, pp_mode=mode, chunked_prefill_size=CHUNK,
        extra_args=("--nnodes", "2", "--dist-init-addr", init_addr, "--tp-size", str(tp_size)),
    )
    bind = "|".join(["0", "1"][:tp_size]) if tp_size > 1 else None

    def node(rank: int) -> ServerConfig:
        return replace(
            base, extra_args=(*base.extra_args, "--node-rank", str(rank)),
            extra_env=(("SGLANG_CPU_OMP_THREADS_BIND", bind or str(rank)),),
        )

    follower = NodeLaunch(node(1), log_dir / "node1.log")
    leader = SGLangServer(node(0), log_dir / "node0.log")
    try:
        follower.start(timeout=600)
        leader.start(timeout=600)
        yield leader, follower
    finally:
        leader.stop()
        follower.stop()


def test_two_nodes_equal_transformers_and_stock_cpp(nodes, reference):
    leader, follower = nodes
    tokens = greedy_tokens_checked(leader, QWEN2_8L, reference, LENGTHS, seed=31)
    mode = leader.config.pp_mode
    if mode == "cpp":
        _CPP_TOKENS[:] = tokens
        return
    if "--tp-size 2" not in " ".join(leader.config.extra_args) and _CPP_TOKENS:
        assert tokens == _CPP_TOKENS, f"--pp-mode {mode} over two nodes differs from stock cpp"
    # Each node's start-up log says which virtual stages it holds.
    held = {
        name: set(re.findall(r"VPP node (\d) holds virtual stages \((\d), (\d)\)", launch.log_tail(10**7)))
        for name, launch in (("node 0", leader), ("node 1", follower))
    }
    assert held["node 0"] == {("0", "0", "3")}, held
    assert held["node 1"] == {("1", "1", "2")}, held
