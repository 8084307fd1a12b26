"""Each range rule is written once: the command and the executor config that both check a value
refuse it with the same flag-named message, from the same function.

A rule the CLI checks early (for an error before any work) and the config checks again (for
callers that are not the CLI: tests, benchmarks, servers) drifts when written twice; these tests
compare the two messages, so a second copy in other words fails here.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sglang_vpp.cli.app import app
from sglang_vpp.runtime.bench_config import BenchConfig
from sglang_vpp.runtime.spec import RequestArrival, RunSpec
from sglang_vpp.sim.runner import RunConfig

_BENCH = ["bench", "--quiet", "--seq-len", "512", "--device", "npu"]  # npu: refused last, so nothing runs


def _cli_error(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0].removeprefix("error: ")


def _error(build) -> str:
    with pytest.raises(ValueError) as caught:
        build()
    return str(caught.value)


def _spec(**changes) -> RunSpec:
    fields = {"model": "tiny-qwen3", "mode": "cpp", "num_ranks": 2, "requests": (RequestArrival(64),),
              "chunk_size": 32, **changes}
    return RunSpec(**fields)


def test_the_rank_count_rule_is_one_message_in_every_command_and_config():
    from sglang_vpp.schedule import LayoutKind, build_layout, check_num_ranks

    message = _error(lambda: check_num_ranks(0))
    assert message == "--pp must be >= 1, got 0"
    assert _cli_error(["simulate", "--pp", "0", "--seq-len", "8k"]) == message
    assert _cli_error(["layout", "--pp", "0", "--layers", "8"]) == message
    assert _cli_error(["schedule", "--mode", "cpp", "--pp", "0", "--seq-len", "64", "--chunk-size", "8"]) == message
    assert _error(lambda: RunConfig(0, 512)) == message
    assert _error(lambda: build_layout(0, 8)) == message

    foldback = _error(lambda: check_num_ranks(1, LayoutKind.FOLDBACK))
    assert "--pp >= 2" in foldback
    assert _cli_error(["simulate", "--pp", "1", "--seq-len", "8k", "--modes", "vpp"]) == foldback
    assert _cli_error(["layout", "--pp", "1", "--layers", "8", "--mode", "vpp"]) == foldback
    assert _error(lambda: build_layout(1, 8, "foldback")) == foldback


def test_a_servers_fold_back_rank_rule_is_the_layouts_with_its_flag():
    from sglang_vpp.schedule import LayoutKind, check_num_ranks
    from sglang_vpp.sglang_plugin.vpp.state import VppConfig

    rule = _error(lambda: check_num_ranks(1, LayoutKind.FOLDBACK, "--pp-size"))
    assert "--pp-size >= 2" in rule
    assert _error(lambda: VppConfig("vpp", 1)) == f"--pp-mode vpp: {rule}"


def test_bench_and_run_spec_refuse_one_rank_alike():
    message = _error(lambda: _spec(num_ranks=1).check())
    assert message.startswith("--pp must be >= 2 for a pipelined run, got 1")
    assert _cli_error(_BENCH + ["--pp", "1"]) == message


@pytest.mark.parametrize("command", [["simulate", "--workload", "mixed"],
                                     ["simulate", "--workload", "short", "--seq-len", "4k"]])
def test_simulate_and_the_workloads_refuse_zero_requests_alike(command):
    from sglang_vpp.sim.workloads import build_workload

    message = _error(lambda: build_workload("mixed", num_requests=0))
    assert message.startswith("--requests must be >= 1, got 0")
    assert _cli_error(command + ["--requests", "0"]) == message


def test_bench_run_spec_and_run_bench_refuse_zero_requests_alike():
    from sglang_vpp.runtime.bench import run_bench
    from sglang_vpp.schedule import check_request_count

    message = _cli_error(_BENCH + ["--requests", "0"])
    assert message == "--requests must be >= 1, got 0"
    assert _error(lambda: _spec(requests=()).check()) == message
    assert _error(lambda: run_bench(BenchConfig(num_requests=0, modes=("cpp",)))) == message
    assert _error(lambda: check_request_count(0, 2, 2, "--requests")) == message
    assert _cli_error(["schedule", "--mode", "cpp", "--pp", "2", "--seq-len", "64", "--chunk-size", "8",
                       "--requests", "0"]) == message


@pytest.mark.parametrize("repeat", [0, 101])
def test_bench_and_run_bench_refuse_a_repeat_count_alike(repeat):
    """``run_bench`` took any count >= 1: a config built without the CLI now has its bound too."""
    from sglang_vpp.runtime.bench import run_bench

    message = _cli_error(_BENCH + ["--repeat", str(repeat)])
    assert message.startswith("--repeat must be ")
    assert _error(lambda: run_bench(BenchConfig(repeat=repeat, modes=("cpp",)))) == message


@pytest.mark.parametrize("repeats", [0, 101])
def test_bench_serve_and_its_launcher_refuse_a_repeat_count_alike(repeats):
    """The launcher took any count >= 1: it now has the command's bound too."""
    from sglang_vpp.cli.bench_serve_launch import run_launched

    # --port 70000 is refused after the range checks: nothing starts whatever they say.
    message = _cli_error(["bench-serve", "--launch", "cpp", "--no-progress", "--port", "70000", "--repeats", str(repeats)])
    assert message.startswith("--repeats must be ")
    assert _error(lambda: run_launched(None, [], repeats=repeats, warm_up=len, run_once=len)) == message


def test_the_executors_refuse_a_chunk_size_alike():
    """The simulator's config took a non-integer size that the runtime's refused: both refuse it now."""
    from sglang_vpp.schedule import FixedChunker, check_chunk_size

    for bad in (0, 512.0):
        message = _error(lambda: check_chunk_size(bad, "--chunk-size"))
        assert message.startswith("--chunk-size must be an integer >= 1 token")
        assert _error(lambda: RunConfig(2, bad)) == message
        assert _error(lambda: _spec(chunk_size=bad).check()) == message
        assert _error(lambda: FixedChunker(bad)) == message.replace("--chunk-size", "chunk size")


@pytest.mark.parametrize("jitter", ["1.5", "-0.1", "nan"])
def test_simulate_and_the_simulator_refuse_a_jitter_alike(jitter):
    """``RunConfig`` took any jitter (only the jittered cost model refused it, when a run began)."""
    from sglang_vpp.schedule import LinearAttentionCost
    from sglang_vpp.sim.cost.jitter import JitteredCostModel

    message = _cli_error(["simulate", "--seq-len", "8k", "--modes", "cpp", "--jitter", jitter])
    assert message.startswith("--jitter must lie in [0, 1]")
    assert _error(lambda: RunConfig(2, 512, jitter=float(jitter))) == message
    assert _error(lambda: JitteredCostModel(LinearAttentionCost(), float(jitter))) == message


@pytest.mark.parametrize("entry", ["workload", "build_workload", "simulate", "bench-serve"])
def test_every_concurrency_is_refused_below_one_by_the_one_check(entry):
    """The workloads, ``simulate`` and ``bench-serve`` refuse ``--concurrency 0`` with one rule,
    each in its own type (``WorkloadError``; ``CliInputError`` for bench-serve's flag)."""
    from sglang_vpp.schedule import RequestSpec
    from sglang_vpp.sim.errors import WorkloadError
    from sglang_vpp.sim.workloads import Workload, build_workload, check_concurrency

    rule = _error(lambda: check_concurrency(0, "--concurrency"))
    assert rule == "--concurrency must be >= 1, got 0"
    if entry == "workload":
        with pytest.raises(WorkloadError, match="^workload 'w': concurrency must be >= 1, got 0$"):
            Workload("w", (RequestSpec(8),), concurrency=0)
    elif entry == "build_workload":
        with pytest.raises(WorkloadError) as caught:
            build_workload("mixed", concurrency=0)
        assert str(caught.value).startswith(rule + "; omit it")
    elif entry == "simulate":
        assert _cli_error(["simulate", "--workload", "mixed", "--concurrency", "0"]).startswith(rule + "; omit it")
    else:
        assert _cli_error(["bench-serve", "--url", "http://127.0.0.1:1", "--no-progress", "--concurrency", "0"]) == rule
