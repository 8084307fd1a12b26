"""The plugin's flags on ``python -m sglang.launch_server``: listed, validated before loading.

Three layers: the real launcher in a subprocess (``--help``, one invalid combination: one line,
exit status 2, no model loaded), and a table of flag combinations run through SGLang's own
``prepare_server_args`` with the plugins loaded, in one subprocess (importing SGLang costs
seconds; the pytest process stays free of SGLang's hooks). The parser script and ``--help``
start together (``runs``): each spends most of its time importing SGLang on one core; the refusal,
whose wall time is checked, runs alone after them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sglang_harness import SKIP_NO_SGLANG

pytestmark = [pytest.mark.slow, pytest.mark.sglang, SKIP_NO_SGLANG]

# (case id, extra argv, expected exit status, text the one-line error must contain)
CASES = [
    ("default-is-cpp", [], 0, None),
    ("dcpp-ok", ["--pp-mode", "dcpp", "--pp-size", "2", "--chunked-prefill-size", "128"], 0, None),
    ("vpp-pp1", ["--pp-mode", "vpp"], 2, "--pp-size is 1"),
    ("vpp-config-error-is-one-line", ["--pp-mode", "vpp", "--pp-size", "2", "--chunked-prefill-size", "64",
                                      "--dp-size", "2"], 2, "does not support --dp-size"),
    ("dcpp-pp1", ["--pp-mode", "dcpp"], 2, "--pp-size is 1"),
    ("vpp-no-chunking", ["--pp-mode", "vpp-async", "--pp-size", "2", "--chunked-prefill-size", "-1"],
     2, "chunked prefill is disabled"),
    ("dcpp-no-chunking", ["--pp-mode", "dcpp", "--pp-size", "2", "--chunked-prefill-size", "-1"],
     2, "chunked prefill is disabled"),
    ("split-length", ["--pp-mode", "vpp", "--pp-size", "2", "--vpp-layer-split", "2,1,1"],
     2, "has 3 entries but --pp-size 2 has 4 virtual stages"),
    ("split-sum", ["--pp-mode", "vpp", "--pp-size", "2", "--chunked-prefill-size", "64",
                   "--vpp-layer-split", "2,2,2,2"],
     2, "covers 8 layers but the model has 4"),
    ("split-without-vpp", ["--pp-size", "2", "--vpp-layer-split", "1,1,1,1"], 2, "only applies to"),
    ("split-not-ints", ["--pp-mode", "vpp", "--pp-size", "2", "--vpp-layer-split", "a,b"],
     2, "not a comma-separated list"),
    ("too-few-layers", ["--pp-mode", "vpp", "--pp-size", "4", "--chunked-prefill-size", "64"],
     2, "needs at least 8 layers"),
    ("vpp-speculative", ["--pp-mode", "vpp", "--pp-size", "2", "--speculative-algorithm", "EAGLE"],
     2, "does not support --speculative-algorithm"),
    ("auto-chunk-stock", ["--pp-size", "2", "--chunked-prefill-size", "auto"], 2, "auto is sized by the VPP controller"),
    ("auto-chunk-vpp", ["--pp-mode", "vpp-pack", "--pp-size", "2", "--chunked-prefill-size", "auto"], 0, None),
    ("fold-fused", ["--pp-mode", "vpp-pack", "--pp-size", "2", "--chunked-prefill-size", "64", "--vpp-fold", "fused",
                    "--vpp-layer-split", "1,2,1"], 0, None),
    ("fold-fused-split-length", ["--pp-mode", "vpp", "--pp-size", "2", "--vpp-fold", "fused",
                                 "--vpp-layer-split", "1,1,1,1"],
     2, "has 4 entries but --pp-size 2 has 3 virtual stages (2 per rank, 1 on the last with --vpp-fold fused)"),
    ("fold-without-vpp", ["--pp-size", "2", "--vpp-fold", "fused"], 2, "--vpp-fold fused only applies to"),
    ("fold-unknown", ["--pp-mode", "vpp", "--pp-size", "2", "--vpp-fold", "zig"], 2, "--vpp-fold: unknown fold 'zig'"),
    ("unknown-mode", ["--pp-mode", "zigzag"], 2, "invalid choice: 'zigzag' (choose from cpp, dcpp, vpp, vpp-async, vpp-pack, vpp-taper, vpp-stream)"),
]  # fmt: skip

_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, pickle, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang_vpp.sglang_plugin.options import options_of
    model, cases = sys.argv[1], json.loads(sys.argv[2])
    results = {}
    for name, argv in cases:
        err = io.StringIO()
        out = {"status": 0}
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(["--model-path", model] + argv)
            # What a spawned scheduler process receives: the pickled record.
            child = pickle.loads(pickle.dumps(args))
            out.update(pp_mode=str(options_of(child).pp_mode),
                       enable_dynamic_chunking=child.enable_dynamic_chunking,
                       chunked_prefill_size=child.chunked_prefill_size,
                       auto_chunk=options_of(child).vpp_auto_chunk,
                       fold=str(options_of(child).vpp_fold))
        except SystemExit as exc:
            out["status"] = exc.code
        out["stderr"] = err.getvalue()
        results[name] = out
    print("RESULTS" + json.dumps(results))
    """
)


def _timed_run(command: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - began


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path) -> dict[str, tuple[subprocess.CompletedProcess, float]]:
    """name -> (finished process, its wall seconds) for the module's three SGLang processes."""
    cases = [(name, argv) for name, argv, _, _ in CASES]
    cases.append(("vpp-valid", ["--pp-mode", "vpp-pack", "--pp-size", "2", "--chunked-prefill-size", "64",
                                "--vpp-layer-split", "1,1,1,1"]))
    commands = {
        "parse": ([sys.executable, "-c", _SCRIPT, str(tiny_model_dir), json.dumps(cases)], 240),
        "help": ([sys.executable, "-m", "sglang.launch_server", "--help"], 240),
        "refuse": ([sys.executable, "-m", "sglang.launch_server", "--model-path", str(tiny_model_dir),
                    "--device", "cpu", "--pp-mode", "vpp", "--pp-size", "1"], 120),
    }  # fmt: skip
    refuse = commands.pop("refuse")
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = {name: pool.submit(_timed_run, *spec) for name, spec in commands.items()}
        done = {name: future.result() for name, future in futures.items()}
    done["refuse"] = _timed_run(*refuse)  # alone: its wall time is part of the check
    return done


@pytest.fixture(scope="module")
def parsed(runs) -> dict:
    done, _ = runs["parse"]
    marker = [line for line in done.stdout.splitlines() if line.startswith("RESULTS")]
    assert marker, f"parser script failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(marker[0][len("RESULTS") :])


def test_auto_chunk_reaches_the_scheduler_as_the_cap(parsed):
    from sglang_vpp.schedule.auto_size import SERVER_CAP

    result = parsed["auto-chunk-vpp"]
    assert (result["chunked_prefill_size"], result["auto_chunk"]) == (SERVER_CAP, True), result


@pytest.mark.parametrize("name,argv,status,message", CASES, ids=[c[0] for c in CASES])
def test_flag_combination(parsed, name, argv, status, message):
    result = parsed[name]
    assert result["status"] == status, result
    if message is not None:
        assert message in result["stderr"], result["stderr"]
        if status == 2:
            # Our refusals are one line, the unknown mode included (no usage block).
            assert len(result["stderr"].strip().splitlines()) == 1, result["stderr"]


def test_mode_survives_the_trip_to_a_subprocess(parsed):
    assert parsed["default-is-cpp"]["pp_mode"] == "cpp"
    assert parsed["default-is-cpp"]["enable_dynamic_chunking"] is False
    assert parsed["dcpp-ok"]["pp_mode"] == "dcpp"
    assert parsed["dcpp-ok"]["enable_dynamic_chunking"] is True  # dcpp = stock PP + SGLang's DCPP


def test_vpp_never_runs_silently_as_stock(parsed):
    result = parsed["vpp-valid"]
    assert result["status"] == 0 and result["pp_mode"] == "vpp-pack"


def test_fold_reaches_the_scheduler(parsed):
    assert parsed["fold-fused"]["fold"] == "fused"
    assert parsed["vpp-valid"]["fold"] == "split"  # the method's fold unless asked


def test_launch_server_help_lists_the_flags(runs):
    done, _ = runs["help"]
    assert done.returncode == 0
    for flag in ("--pp-mode {cpp,dcpp,vpp,vpp-async,vpp-pack,vpp-taper,vpp-stream}", "--vpp-layer-split", "--vpp-fold", "--vpp-trace"):
        assert flag in done.stdout


def test_launch_server_refuses_before_loading_the_model(runs):
    done, seconds = runs["refuse"]
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [
        "sglang serve: error: --pp-mode vpp needs pipeline parallelism but --pp-size is 1; "
        "pass --pp-size 2 (or more), or use --pp-mode cpp"
    ]
    assert "Load weight" not in done.stdout + done.stderr
    assert seconds < 100
