"""SIGTERM / SIGHUP unwind ``bench-serve --launch`` through its finally blocks, so its servers stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_vpp.serving.termination import stop_signals_as_exit


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_raises_system_exit_and_the_handler_comes_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(SystemExit) as caught, stop_signals_as_exit():
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs at the next bytecode; never reached
    assert caught.value.code == 128 + sig
    assert signal.getsignal(sig) is before


_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from sglang_vpp.cli import bench_serve_launch as launch
    from sglang_vpp.serving.launcher import SGLangServer

    marker = Path(sys.argv[1])

    def spawn(self):
        marker.with_suffix(".started").write_text("up")

    def wait_healthy(self, deadline, on_wait):
        time.sleep(60)  # a server that takes its time to come up

    def stop(self, grace=10.0):
        marker.write_text("stopped")

    # The real start (its error handling included) around a fake process.
    launch.check_can_launch = lambda: None
    SGLangServer._spawn, SGLangServer._wait_healthy, SGLangServer.stop = spawn, wait_healthy, stop
    spec = launch.LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64, work_dir=marker.parent / "w")
    launch.run_launched(spec, ["cpp"], repeats=1, warm_up=lambda url: 0, run_once=lambda url, r: None)
""")


def test_bench_serve_launch_stopped_by_sigterm_stops_its_server(tmp_path):
    marker = tmp_path / "server"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.with_suffix(".started").exists():
            assert child.poll() is None and time.monotonic() < deadline, "the fake server never started"
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        child.kill()
    assert marker.read_text() == "stopped"  # the finally block ran: the server's process group was stopped
