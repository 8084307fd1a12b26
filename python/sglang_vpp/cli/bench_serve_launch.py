"""``sglang-vpp bench-serve --launch MODES``: start one server per ``--pp-mode``, measure each in turn.

Data flow (per mode, one server alive at a time)::

    ServerConfig(model, --pp-size, --pp-mode MODE, --chunked-prefill-size, --vpp-trace WORK_DIR/trace-MODE)
      -> SGLangServer.start() (log in DIR/MODE.log)
      -> warm-up pass of bench_serving (``warm_up`` returns how many requests it sent);
         wait_for_records(): the seq reached so far
      -> for each repeat: run_once(url, repeat) -> ServingPass (one bench_serving run, fresh
         prompts per repeat);
         wait_for_records() -> measure_idle(): replayed per-rank prefill idle of that repeat
         host_time(): the scheduler thread's CPU time between forwards, per micro-batch
      -> stop the server (always, on errors too)
    -> one LaunchedRun per mode: label, server facts, summaries, per-repeat idle

With ``--pd`` each mode's server is the prefill server of a prefill-decode split instead: one
pp-1 decode server for the whole run, each prefill server and SGLang's router in turn
(``serving/pd_launcher.py``), and every pass goes through the router (docs/pd.md).

The per-rank idle is rebuilt from each stage compute's thread CPU time as if every rank had its
own device (``serving/record_replay.py``); wall-clock numbers of ranks sharing a small machine's cores
are not a pipeline measurement and are never reported as one.
"""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from sglang_vpp import json_text
from sglang_vpp.schedule.auto_size import AUTO, SERVER_CAP, is_auto
from sglang_vpp.schedule.layout import check_num_ranks
from sglang_vpp.schedule.policies import FOLDBACK_MODES
from sglang_vpp.schedule.policies.spec import Policy
from sglang_vpp.serving.launcher import CPU_PLATFORM_ARGS, ServerConfig, SGLangServer, free_port
from sglang_vpp.serving.host_time import HostTime, host_time
from sglang_vpp.verdict import check_repeats
from sglang_vpp.serving.pipeline_report import PipelineIdle, last_seq, measure_idle, min_cost_idle, wait_for_records

__all__ = ["LaunchSpec", "LaunchedRun", "check_can_launch", "check_launch_args", "model_context_len",
           "parse_modes", "port_range_error", "STARTUP_TIMEOUT_S", "run_launched", "default_model_dir", "starting_event", "starting_mode"]

ALL_MODES = tuple(p.value for p in Policy)
"""What ``--launch all`` starts: every mode the plugin serves (with ``--pd``, as prefill servers)."""


REPEATS_UNIT = "passes per server"
"""What one ``--repeats`` is, in its range message (``verdict.check_repeats``)."""

STARTUP_TIMEOUT_S = 600.0
"""``--startup-timeout``'s default: seconds one server may take to become healthy (loading the
model, SGLang's own start-up profiling)."""


class LaunchError(ValueError):
    """A bad --launch option (the message names the value and the fix)."""


def parse_modes(text: str) -> list[str]:
    """``cpp,vpp-pack`` or ``all`` -> the modes, in the order given, validated."""
    modes = list(ALL_MODES) if text.strip() == "all" else [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ALL_MODES]
    if bad or not modes:
        raise LaunchError(f"--launch {text!r}: unknown mode(s) {', '.join(bad)}; choose from {', '.join(ALL_MODES)} or 'all'")
    if len(set(modes)) != len(modes):
        raise LaunchError(f"--launch {text!r} names a mode twice")
    return modes


def starting_event(mode: str, detail: str) -> str:
    """The event that ``mode``'s server starts: what follows belongs to ``mode`` (``starting_mode``)."""
    return f"starting --pp-mode {mode} {detail}"


def starting_mode(text: str, modes: list[str]) -> str | None:
    """The mode whose ``starting_event`` ``text`` is, or None."""
    return next((mode for mode in modes if text.startswith(starting_event(mode, ""))), None)


MAX_PORT = 65535
"""The highest TCP port."""


def port_range_error(first_port: int, num_servers: int) -> str | None:
    """Why ``num_servers`` servers cannot listen on ``first_port`` and the ports after it (server i
    on ``first_port + i``, so the last on ``first_port + num_servers - 1``), or None."""
    last_port = first_port + num_servers - 1
    if 0 < first_port and last_port <= MAX_PORT:
        return None
    return f"--port {first_port}: {num_servers} server(s) need ports {first_port}..{last_port}, all in 1..{MAX_PORT}"


#: What --launch imports: SGLang to serve, transformers to build the default tiny model.
LAUNCH_REQUIREMENTS = ("sglang", "transformers")


def missing_requirements() -> list[str]:
    return [name for name in LAUNCH_REQUIREMENTS if importlib.util.find_spec(name) is None]


def check_can_launch() -> None:
    """One line instead of an import error deep in the model build when SGLang is not installed."""
    missing = missing_requirements()
    if missing:
        raise LaunchError(f"--launch needs {' and '.join(missing)} in this environment (not installed); "
                          "run scripts/install_sglang_cpu.sh, or use --url with a running server")


#: launch_server options (by argparse dest) the launcher sets, with the bench-serve flag that sets them.
_LAUNCHER_SET = {"model_path": "--model-path", "pp_size": "--pp-size", "pp_mode": "--launch",
                 "chunked_prefill_size": "--chunked-prefill-size", "device": "--device", "port": "--port",
                 "host": None}


def check_launch_args(spec: LaunchSpec, modes: list[str]) -> None:
    """What ``bench`` and the plugin refuse, refused here before any server starts: a device this
    host lacks, and each mode's server command line as the plugin's argument check sees it."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_vpp.runtime.bench import check_device
    from sglang_vpp.runtime.spec import Device
    from sglang_vpp.serving.results import option_value
    from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args, check_namespace

    if spec.device in tuple(Device):
        check_device(Device(spec.device))
    if option_value(spec.server_args, "--vpp-trace") is not None:
        # The launcher's own --vpp-trace comes last and wins: the given directory would stay empty.
        raise LaunchError("--server-arg sets --vpp-trace, which bench-serve sets itself (trace-MODE under "
                          "--work-dir); use bench-serve's --work-dir")
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    if "--pp-mode" not in parser._option_string_actions:  # the plugin's hook adds them when loaded
        add_pipeline_args(parser)
    for mode in modes:
        config = spec.config(mode, Path("trace"))
        command = config.command(port=1)
        try:
            namespace, _unknown = parser.parse_known_args(command[3:])
            own, _ = parser.parse_known_args(replace(config, extra_args=("--vpp-trace", "trace")).command(port=1)[3:])
        except (argparse.ArgumentError, SystemExit):
            return  # a --server-arg SGLang's parser refuses: the server says so in its own words
        # The last copy of a flag wins: a --server-arg one would run another server than the
        # one every result is labelled with.
        for dest, option in _LAUNCHER_SET.items():
            if getattr(namespace, dest, None) != getattr(own, dest, None):
                raise LaunchError(f"--launch {mode}: --server-arg sets {dest.replace('_', '-')} to "
                                  f"{getattr(namespace, dest)!r}, which bench-serve sets itself; "
                                  + (f"use bench-serve's {option}" if option else "drop that --server-arg"))
        try:
            check_namespace(namespace)
        except ValueError as error:
            raise LaunchError(f"--launch {mode}: {error}") from None


def model_context_len(spec: LaunchSpec) -> int | None:
    """The context length the servers will have, before any starts: ``--context-length`` among
    ``--server-arg``, else the model's ``max_position_embeddings`` (what SGLang derives it from),
    else None (not readable here: each server's own answer is checked when it is up)."""
    from sglang_vpp.serving.results import option_value

    given = option_value(spec.server_args, "--context-length")
    if given is not None:
        return int(given) if given.isdigit() else None
    config = Path(spec.model_dir).expanduser() / "config.json"
    try:
        data = json_text.loads(config.read_text())
    except (OSError, ValueError):
        return None
    for section in (data, data.get("text_config") or {}):
        if isinstance(section.get("max_position_embeddings"), int):
            return section["max_position_embeddings"]
    return None


def default_model_dir() -> str:
    """The embedded default: a tiny 8-layer Qwen2 built locally (seeded weights, local tokenizer)."""
    from sglang_vpp.models.tiny_hf import TinyModelSpec, cache_dir, cached_tiny_model

    from .common import echo_wrapped

    path = cached_tiny_model(TinyModelSpec("qwen2-tiny", num_layers=8))
    # Built once and kept: say where, and what moves it (the user never named this directory).
    echo_wrapped(f"model: {path} (the tiny default, built once under {cache_dir()}; set "
                 "SGLANG_VPP_CACHE_DIR to keep it elsewhere)", err=True)
    return str(path)


@dataclass(frozen=True)
class LaunchSpec:
    model_dir: str
    pp_size: int
    chunked_prefill_size: int | str
    """Tokens, or ``auto``: vpp modes get ``auto`` (the controller sizes each chunk), cpp and dcpp
    the cap SGLang gets with it (``auto_size.SERVER_CAP``)."""
    device: str = "cpu"
    server_args: tuple[str, ...] = ()
    startup_timeout: float = STARTUP_TIMEOUT_S
    work_dir: Path | None = None
    """Logs and traces go here (a fresh temporary directory when None)."""
    first_port: int = 0
    """Mode i listens on ``first_port + i``; 0: each server gets a free port."""
    pd: bool = False
    """Serve each mode as the prefill server of a prefill-decode split, behind SGLang's router."""

    def config(self, mode: str, trace_dir: Path) -> ServerConfig:
        try:
            check_num_ranks(self.pp_size, flag="--pp-size")
        except ValueError as error:
            raise LaunchError(str(error)) from None
        size = self.chunked_prefill_size
        if is_auto(size):
            size = AUTO if Policy(mode) in FOLDBACK_MODES else SERVER_CAP
        elif size < 1:
            raise LaunchError(f"--chunked-prefill-size must be >= 1, got {self.chunked_prefill_size}")
        platform = CPU_PLATFORM_ARGS if self.device == "cpu" else ("--device", self.device)
        return ServerConfig(
            model_dir=self.model_dir, pp_size=self.pp_size, pp_mode=mode,
            chunked_prefill_size=size, platform_args=platform,
            extra_args=(*self.server_args, "--vpp-trace", str(trace_dir)),
        )  # fmt: skip


    def decode_config(self) -> ServerConfig:
        """The decode server of ``--pd``: stock, pp 1, the same model, chunk and device flags."""
        platform = CPU_PLATFORM_ARGS if self.device == "cpu" else ("--device", self.device)
        size = SERVER_CAP if is_auto(self.chunked_prefill_size) else self.chunked_prefill_size
        return ServerConfig(model_dir=self.model_dir, chunked_prefill_size=size,
                            platform_args=platform, extra_args=self.server_args)


@dataclass
class LaunchedRun:
    """What one mode's server measured."""

    mode: str
    url: str
    log_path: str
    start_seconds: float
    passes: list[Any] = field(default_factory=list)
    """``serving.bench_serving.ServingPass`` per repeat."""
    idle: list[PipelineIdle] = field(default_factory=list)
    host: list[HostTime | None] = field(default_factory=list)
    """Host time per micro-batch of each repeat (``serving/host_time.py``)."""
    notes: list[str] = field(default_factory=list)

    def replayed_makespans(self) -> list[float]:
        """Per repeat: the replayed prefill makespan (the longest rank's replayed timeline)."""
        return [max(rank.makespan_s for rank in idle.ranks) for idle in self.idle if idle.ranks]

    def min_cost_idle(self) -> PipelineIdle | None:
        """The replay of each compute's minimum CPU time over the repeats (None if not comparable)."""
        return min_cost_idle(self.idle)

    def idle_spread(self) -> list[dict[str, float]]:
        """Per rank: min / median / max over repeats of the replayed idle seconds and fraction."""
        out = []
        for rank in range(self.idle[0].num_ranks if self.idle else 0):
            seconds = [run.ranks[rank].idle_s for run in self.idle]
            fractions = [run.ranks[rank].idle_fraction for run in self.idle]
            out.append({
                "rank": rank,
                "idle_s": {"min": min(seconds), "median": statistics.median(seconds), "max": max(seconds)},
                "idle_fraction": {"min": min(fractions), "median": statistics.median(fractions), "max": max(fractions)},
            })  # fmt: skip
        return out


def _notes_from_log(mode: str, log_text: str) -> list[str]:
    notes = []
    if mode == "dcpp" and "Failed to fit the chunk-size predictor" in log_text:
        notes.append(
            "dcpp: SGLang could not fit its chunk-size predictor at start-up (timing noise) and "
            "served fixed chunks; this run is cpp in effect"
        )
    return notes


def run_launched(
    spec: LaunchSpec,
    modes: list[str],
    *,
    repeats: int,
    warm_up: Callable[[str], int],
    run_once: Callable[[str, int], Any],
    on_event: Callable[[str], None] = lambda _m: None,
    on_wait: Callable[[str, float, str], None] | None = None,
    deployment: Any = None,
) -> list[LaunchedRun]:
    """Start, measure and stop one server per mode (module docstring). ``--pd``: ``deployment``
    (a ``PdDeployment`` with its decode server up, e.g. a test session's) serves the prefill
    servers and is left running; None starts one and stops it at the end."""
    try:
        check_repeats(repeats, "--repeats", REPEATS_UNIT)
    except ValueError as error:
        raise LaunchError(str(error)) from None
    port_error = port_range_error(spec.first_port, len(modes)) if spec.first_port else None
    if port_error:
        raise LaunchError(port_error)
    for mode in modes:
        spec.config(mode, Path("."))  # option errors before any server starts
    check_can_launch()
    work_dir = make_work_dir(spec.work_dir)
    from sglang_vpp.serving.termination import stop_signals_as_exit

    with stop_signals_as_exit():  # a SIGTERM stops the servers too, through the finally blocks
        return _launch(spec, modes, work_dir, repeats, warm_up, run_once, on_event, on_wait, deployment)


def make_work_dir(work_dir: Path | None) -> Path:
    """A run's work dir (a new temporary one when None); callers make it once every check has
    passed, so a refused run leaves no directory behind."""
    out_dir = work_dir or Path(tempfile.mkdtemp(prefix="sglang-vpp-bench-serve-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def _launch(spec: LaunchSpec, modes: list[str], work_dir: Path, repeats: int, warm_up: Callable[[str], int],
            run_once: Callable[[str, int], Any], on_event: Callable[[str], None],
            on_wait: Callable[[str, float, str], None] | None, deployment: Any) -> list[LaunchedRun]:
    if not spec.pd:
        return _run_modes(spec, modes, work_dir, None, repeats, warm_up, run_once, on_event, on_wait)
    if deployment is not None:
        return _run_modes(spec, modes, work_dir, deployment, repeats, warm_up, run_once, on_event, on_wait)
    from sglang_vpp.serving.pd_launcher import PdDeployment, decode_config

    deployment = PdDeployment(log_dir=work_dir)
    try:
        on_event("starting the pp-1 decode server of the prefill-decode split")
        deployment.start_decode(decode_config(spec.decode_config()), timeout=spec.startup_timeout)
        return _run_modes(spec, modes, work_dir, deployment, repeats, warm_up, run_once, on_event, on_wait)
    finally:
        deployment.stop()


def _start_mode(spec: LaunchSpec, mode: str, trace_dir: Path, log_path: Path, port: int, deployment: Any,
                on_event: Callable[[str], None],
                on_wait: Callable[[str, float, str], None] | None) -> tuple[SGLangServer, str]:
    """Start ``mode``'s server (with ``--pd``: as the prefill server, and its router): it and the URL to load."""
    if deployment is not None:
        from sglang_vpp.serving.pd_launcher import prefill_config

        on_event(starting_event(mode, "as the prefill server, and the router"))
        config = prefill_config(spec.config(mode, trace_dir), free_port())
        router = deployment.serve_prefill(config, timeout=spec.startup_timeout)
        return deployment.prefill, router.url
    server = SGLangServer(spec.config(mode, trace_dir), log_path, port=port)
    on_event(starting_event(mode, f"(log {server.log_path})"))
    waiting = None if on_wait is None else (lambda elapsed, line, mode=mode: on_wait(mode, elapsed, line))
    server.start(timeout=spec.startup_timeout, on_wait=waiting)
    return server, server.url


def _run_modes(spec: LaunchSpec, modes: list[str], work_dir: Path, deployment: Any, repeats: int,
               warm_up: Callable[[str], int], run_once: Callable[[str, int], Any],
               on_event: Callable[[str], None],
               on_wait: Callable[[str, float, str], None] | None) -> list[LaunchedRun]:
    runs = []
    for index, mode in enumerate(modes):
        trace_dir = work_dir / f"trace-{mode}"
        port = spec.first_port + index if spec.first_port else 0
        server, url = _start_mode(spec, mode, trace_dir, work_dir / f"server-{mode}.log", port, deployment,
                                  on_event, on_wait)
        try:
            run = LaunchedRun(mode=mode, url=url, log_path=str(server.log_path), start_seconds=server.start_seconds)
            began = time.time()
            after_seq = -1
            if warm_up(url):
                after_seq = last_seq(wait_for_records(trace_dir, spec.pp_size, since=began))
            for repeat in range(repeats):
                on_event(f"--pp-mode {mode}: repeat {repeat + 1}/{repeats}")
                began = time.time()
                serving_pass = run_once(url, repeat)
                records = wait_for_records(trace_dir, spec.pp_size, since=began)
                run.passes.append(serving_pass)
                run.idle.append(measure_idle(records, spec.pp_size, after_seq))
                run.host.append(host_time(records, spec.pp_size, after_seq))
                after_seq = last_seq(records)
            run.notes = _notes_from_log(mode, server.log_tail(10**7))
        finally:
            server.stop() if deployment is None else deployment.stop_prefill()
        runs.append(run)
    return runs

