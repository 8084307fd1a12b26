"""Freeze the CLI surface: command names and their flags are a contract others test against.

Adding a flag or a command is fine but deliberate: refresh with ``pytest tests/cli --update-golden``
and review the diff. Removing or renaming one fails here.
"""

import json
from pathlib import Path

import pytest
import typer.main

from sglang_vpp.cli.app import app

GOLDEN = Path(__file__).parent.parent / "golden" / "cli_surface.json"

# Named by the issues; these must always exist.
REQUIRED = {
    "layout": {"--pp", "--layers", "--mode", "--split", "--json"},
    "schedule": {"--mode", "--pp", "--seq-len", "--chunk-size", "--requests", "--format"},
    "check": {"--mode", "--pp", "--seq-len", "--chunk-size", "--requests", "--groups", "--json"},
    "simulate": {"--model", "--hardware", "--pp", "--workload", "--seq-len", "--chunk-size", "--modes",
                 "--requests", "--sweep-chunk", "--json", "--trace", "--plot"},
    "bench": {"--backend", "--model", "--pp", "--seq-len", "--chunk-size", "--modes", "--requests", "--repeat",
              "--json", "--trace", "--plot", "--device"},
    "bench-serve": {"--url", "--workload", "--json"},
    "doctor": {"--backend"},
}


def _surface() -> dict[str, list[str]]:
    group = typer.main.get_command(app)
    surface = {}
    for name, command in sorted(group.commands.items()):
        # secondary_opts: the off switch of an on/off flag (``--no-batch-requests``) is a contract too
        flags = sorted(opt for param in command.params
                       for opt in (*getattr(param, "opts", []), *getattr(param, "secondary_opts", []))
                       if opt.startswith("--"))
        surface[name] = flags
    return surface


def test_required_commands_and_flags_exist():
    surface = _surface()
    for command, flags in REQUIRED.items():
        assert command in surface, f"command {command} is missing"
        missing = flags - set(surface[command])
        assert not missing, f"{command} lost flags {sorted(missing)}"


def test_no_new_cli_options(update_golden):
    surface = _surface()
    if update_golden:
        GOLDEN.write_text(json.dumps(surface, indent=2, sort_keys=True) + "\n")
        pytest.skip("golden CLI surface rewritten")
    # A missing golden is a failure: writing it here would make the test pass on any surface.
    assert GOLDEN.exists(), f"{GOLDEN} is missing: create it with --update-golden and review it"
    assert surface == json.loads(GOLDEN.read_text()), "CLI surface changed: review, then --update-golden"


def test_default_mode_lists_follow_the_policies():
    from sglang_vpp.cli.bench_serve_launch import ALL_MODES, parse_modes
    from sglang_vpp.runtime.spec import DEFAULT_MODES
    from sglang_vpp.schedule import Policy
    from sglang_vpp.sglang_plugin.options import SERVED_MODES

    group = typer.main.get_command(app)

    def default(command: str, flag: str):
        return next(p.default for p in group.commands[command].params if flag in p.opts)

    every = [p.value for p in Policy]
    assert default("simulate", "--modes").split(",") == every
    assert default("bench", "--modes").split(",") == list(DEFAULT_MODES) == [m for m in every if m not in ("vpp-taper", "vpp-stream")]
    assert list(ALL_MODES) == parse_modes("all") == every == [m.value for m in SERVED_MODES]


def test_docs_cli_names_every_command_and_flag():
    """docs/cli.md has a section per command that names each of its flags (``--x`` or ``--x/--no-x``)."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    sections = {m.group(1): body for m, body in zip(re.finditer(r"^## `([\w-]+)`", text, re.M),
                                                     re.split(r"^## `[\w-]+`", text, flags=re.M)[1:])}
    group = typer.main.get_command(app)
    missing = {}
    for name, command in group.commands.items():
        assert name in sections, f"docs/cli.md has no section for {name}"
        flags = [o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
        gaps = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", sections[name])]
        if gaps:
            missing[name] = gaps
    assert not missing, f"flags not documented in docs/cli.md: {missing}"


def _default(command: str, flag: str):
    group = typer.main.get_command(app)
    return next(p.default for p in group.commands[command].params if flag in p.opts)


def test_bench_flags_default_to_the_bench_config():
    """``bench``'s flags take their defaults from ``BenchConfig`` (one place), and ``--repeat`` stays
    the documented 5 (docs/cli.md), so a config built in code runs what the command runs."""
    from sglang_vpp.cli.common import parse_size_option
    from sglang_vpp.runtime.bench_config import BenchConfig

    config = BenchConfig()
    assert _default("bench", "--repeat") == config.repeat == 5
    assert parse_size_option(_default("bench", "--seq-len"), "--seq-len") == config.seq_len
    assert parse_size_option(_default("bench", "--chunk-size"), "--chunk-size") == config.chunk_size
    assert tuple(_default("bench", "--modes").split(",")) == config.modes
    assert (_default("bench", "--model"), _default("bench", "--pp"), _default("bench", "--requests"),
            _default("bench", "--arrival-interval"), _default("bench", "--device"), _default("bench", "--backend"),
            _default("bench", "--seed"), _default("bench", "--fold"), _default("bench", "--timeout"),
            _default("bench", "--batch-requests"), _default("bench", "--partial-fill")) == (
        config.model, config.num_ranks, config.num_requests, config.arrival_interval_s, str(config.device),
        config.backend, config.seed, config.fold, config.timeouts.comm_s, config.batch_requests, config.partial_fill)


def test_bench_fills_its_batches_by_default_and_records_what_ran():
    """``bench`` fills as SGLang's adder does wherever it batches; without batches there is
    nothing to fill, so the default is off there and an explicit ``--partial-fill`` is refused."""
    from sglang_vpp.runtime.bench_config import BenchConfig
    from sglang_vpp.runtime.errors import RunConfigError

    assert BenchConfig().fills and BenchConfig().run_spec("cpp").partial_fill
    unbatched = BenchConfig(batch_requests=False)
    assert not unbatched.fills and not unbatched.run_spec("cpp").partial_fill
    assert unbatched.to_dict()["partial_fill"] is False and BenchConfig().to_dict()["partial_fill"] is True
    assert not BenchConfig(partial_fill=False).run_spec("cpp").partial_fill
    with pytest.raises(RunConfigError, match="--partial-fill needs --batch-requests"):
        BenchConfig(batch_requests=False, partial_fill=True).run_spec("cpp").check()


def test_bench_serve_startup_timeout_defaults_to_the_launch_spec():
    from sglang_vpp.cli.bench_serve_launch import STARTUP_TIMEOUT_S, LaunchSpec

    spec = LaunchSpec(model_dir="m", pp_size=2, chunked_prefill_size=64)
    assert _default("bench-serve", "--startup-timeout") == spec.startup_timeout == STARTUP_TIMEOUT_S
