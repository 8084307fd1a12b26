"""The declared SGLang surface (sglang_plugin/surface.py): complete, true on the installed SGLang,
checked at start-up in every mode, and an upgrade drill against a monkeypatched SGLang."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from surface_scan import CLASS_SWAP, scan  # noqa: E402

from sglang_vpp.sglang_plugin.errors import PpModeError  # noqa: E402
from sglang_vpp.sglang_plugin.options import (  # noqa: E402
    COMM_TIMEOUT_ENV,
    DEFAULT_COMM_TIMEOUT_S,
    EXPECTED_MODE_ENV,
    OPTIONS_ATTR,
    PipelineOptions,
    attach,
    check_options_reached,
    check_options_travel,
)
from sglang_vpp.sglang_plugin.surface import SURFACE, Scope, Use  # noqa: E402
from sglang_vpp.sglang_plugin.validate import SCHEDULER_OPTIONS, VPP_REFUSALS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "sglang_vpp"
SURFACE_FILE = "python/sglang_vpp/sglang_plugin/surface.py"


def _declared(name: str) -> bool:
    paths = {entry.path for entry in SURFACE}
    if name == CLASS_SWAP:
        return any(entry.use is Use.SWAP for entry in SURFACE)
    if name.startswith("*."):
        return any(path.endswith(name[1:]) for path in paths)
    return name in paths or any(path.startswith(name + ".") for path in paths)


def test_every_sglang_name_the_code_touches_is_declared():
    touches = scan([PACKAGE / "sglang_plugin", PACKAGE / "serving"], ROOT)
    missing = [touch for touch in touches if not _declared(touch.name) and touch.file != SURFACE_FILE]
    assert not missing, "SGLang names used but not declared; add one line each to SURFACE in " + SURFACE_FILE + \
        ":\n" + "\n".join(f"  {t.file}:{t.line}: {t.name} ({t.how}): N(\"{_suggested_path(t.name)}\", "
                          "<Use>, <Scope>, (<params relied on>))" for t in missing)


def _suggested_path(name: str) -> str:
    if name == CLASS_SWAP:
        return "sglang.<module>.<Class whose instances get a new class>"
    return "sglang.<module>.<Class>" + name[1:] if name.startswith("*.") else name


def test_the_scanner_sees_what_it_must():
    """The AST rules catch each kind of touch (so a new private call or hook string fails above)."""
    names = {touch.name for touch in scan([PACKAGE / "sglang_plugin", PACKAGE / "serving"], ROOT)}
    for name in ("sglang.srt.managers.scheduler.Scheduler._pp_prepare_tensor_dict",  # role, private
                 "sglang.srt.managers.scheduler.Scheduler._engine_paused",
                 "sglang.srt.distributed.parallel_state._PP",  # module attribute
                 "sglang.srt.utils.watchdog.SubprocessWatchdog._processes",  # getattr with a default
                 "*._is_cpu",  # private state through sys.modules
                 "sglang.srt.managers.scheduler._dispatch_event_loop_once",  # hook target string
                 "sglang.benchmark.serving", CLASS_SWAP,
                 "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.kv_buffer"):  # annotated parameter
        assert name in names, name


def test_declarations_are_unique_and_hooks_are_the_hook_targets():
    from sglang_vpp.sglang_plugin.hook_targets import HOOK_TARGETS

    keys = [(entry.path, entry.use, entry.scope) for entry in SURFACE]
    assert len(keys) == len(set(keys))
    assert {t.path for t in HOOK_TARGETS} == {e.path for e in SURFACE if e.use is Use.HOOK}
    fields = {e.path.rsplit(".", 1)[1] for e in SURFACE if ".ServerArgs." in e.path}
    assert {refusal.attr for refusal in VPP_REFUSALS} <= fields


@pytest.mark.sglang
def test_the_surface_holds_on_the_installed_sglang():
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    from sglang_vpp.sglang_plugin.surface import find_problems

    assert find_problems(tuple(Scope)) == []



_CLASSES_SOURCE = """
    import dataclasses


    class Base:
        def __init__(self):
            self.a = 1
            self.b, (self.c, other) = 2, (3, 4)

        def later(self):
            self.d: int = 5
            self.e += 1

            def inner():
                self.f = 6

            for self.g in range(1):
                pass


    class Mixin:
        def set_up(self):
            self.m = 1

        class Nested:
            def __init__(self):
                self.n = 1


    def factory():
        class Local:
            def __init__(self):
                self.l = 1

        return Local


    @dataclasses.dataclass
    class Decorated:
        x: int = 0

        def __post_init__(self):
            self.y = 1
"""


def _import_file(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


def _instance_attributes(module) -> dict[str, frozenset[str]]:
    from sglang_vpp.sglang_plugin import surface

    classes = [module.Base, module.Mixin, module.Mixin.Nested, module.factory(), module.Decorated]
    return {klass.__qualname__: surface._self_attributes(klass) for klass in classes}


def _new_process(monkeypatch) -> None:
    """Empty every in-memory cache of the surface check, as a process that starts does."""
    from sglang_vpp.sglang_plugin import surface

    monkeypatch.setattr(surface, "_BY_FILE", {}, raising=False)
    monkeypatch.setattr(surface, "_ON_DISK", {}, raising=False)
    surface._self_attributes.cache_clear()


def test_instance_attributes_come_from_one_parse_per_file_then_from_the_cache(tmp_path, monkeypatch):
    """The start-up check's ``self.x`` assignments per class: one parse of a file serves all its
    classes, and a later process (here: the in-memory caches emptied) reads them from the
    on-disk cache without parsing, until the file changes."""
    import ast

    from sglang_vpp.sglang_plugin import surface

    monkeypatch.setenv("SGLANG_VPP_CACHE_DIR", str(tmp_path / "cache"))
    _new_process(monkeypatch)
    source = tmp_path / "surface_drill_classes.py"
    source.write_text(textwrap.dedent(_CLASSES_SOURCE))
    module = _import_file(source)
    parses = []
    real_parse = ast.parse
    monkeypatch.setattr(ast, "parse", lambda *args, **kwargs: parses.append(1) or real_parse(*args, **kwargs))
    expected = {
        "Base": frozenset("abcdefg"), "Mixin": frozenset("mn"), "Mixin.Nested": frozenset("n"),
        "factory.<locals>.Local": frozenset("l"), "Decorated": frozenset("y"),
    }
    try:
        assert _instance_attributes(module) == expected
        assert len(parses) == 1

        _new_process(monkeypatch)
        assert _instance_attributes(module) == expected
        assert len(parses) == 1  # read back, not parsed

        with source.open("a") as out:
            out.write("\n\nclass Late:\n    def __init__(self):\n        self.z = 1\n")
        _new_process(monkeypatch)
        module = _import_file(source)
        assert _instance_attributes(module) == expected
        assert surface._self_attributes(module.Late) == frozenset("z")
        assert len(parses) == 2  # the changed file was parsed again

        # A rewrite of the same size and modification time (within one clock tick) is a change too.
        stat = source.stat()
        source.write_text(source.read_text().replace("self.z = 1", "self.w = 1"))
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert source.stat().st_size == stat.st_size
        _new_process(monkeypatch)
        module = _import_file(source)
        assert surface._self_attributes(module.Late) == frozenset("w")
        assert len(parses) == 3
    finally:
        surface._self_attributes.cache_clear()
        sys.modules.pop(source.stem, None)


def test_an_unwritable_cache_only_costs_the_parse(tmp_path, monkeypatch):
    from sglang_vpp.sglang_plugin import surface

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("SGLANG_VPP_CACHE_DIR", str(blocker))
    _new_process(monkeypatch)
    source = tmp_path / "surface_drill_unwritable.py"
    source.write_text(textwrap.dedent(_CLASSES_SOURCE))
    try:
        assert _instance_attributes(_import_file(source))["Base"] == frozenset("abcdefg")
        assert sorted(path.name for path in tmp_path.iterdir()) == ["not-a-directory", source.name]
    finally:
        surface._self_attributes.cache_clear()
        sys.modules.pop(source.stem, None)

def _source_files(folder: Path, count: int) -> list[Path]:
    paths = []
    for index in range(count):
        path = folder / f"surface_drill_cache_{index}.py"
        path.write_text(f"class Holder{index}:\n    def __init__(self):\n        self.v{index} = 1\n")
        paths.append(path)
    return paths


def _cached_files(tmp_path: Path) -> list[str]:
    import json

    (cache,) = (tmp_path / "cache" / "surface").glob("self-attributes-*.json")
    return list(json.loads(cache.read_text())["files"])


def test_a_process_reads_the_cache_file_once_for_all_the_files_it_checks(tmp_path, monkeypatch):
    from sglang_vpp.sglang_plugin import surface

    monkeypatch.setenv("SGLANG_VPP_CACHE_DIR", str(tmp_path / "cache"))
    sources = _source_files(tmp_path, 3)
    try:
        _new_process(monkeypatch)
        modules = [_import_file(path) for path in sources]
        for index, module in enumerate(modules):
            assert surface._self_attributes(getattr(module, f"Holder{index}")) == frozenset({f"v{index}"})
        _new_process(monkeypatch)
        reads = []
        real_read = Path.read_text
        monkeypatch.setattr(Path, "read_text", lambda self, *args, **kwargs: (
            reads.append(self.name) if self.name.startswith("self-attributes") else None) or real_read(self, *args, **kwargs))
        for index, module in enumerate(modules):
            assert surface._self_attributes(getattr(module, f"Holder{index}")) == frozenset({f"v{index}"})
        assert len(reads) == 1, reads
    finally:
        surface._self_attributes.cache_clear()
        for path in sources:
            sys.modules.pop(path.stem, None)


def test_the_cache_keeps_the_newest_entries_of_files_that_exist(tmp_path, monkeypatch):
    """Entries of files that are gone (a removed venv or SGLang version) and the oldest past
    ``CACHE_MAX_ENTRIES`` are dropped when the cache is written, so it cannot grow without end."""
    from sglang_vpp.sglang_plugin import surface

    monkeypatch.setenv("SGLANG_VPP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(surface, "CACHE_MAX_ENTRIES", 2, raising=False)
    sources = _source_files(tmp_path, 4)
    try:
        _new_process(monkeypatch)
        for index, path in enumerate(sources[:3]):
            surface._self_attributes(getattr(_import_file(path), f"Holder{index}"))
        assert _cached_files(tmp_path) == [str(sources[1]), str(sources[2])]  # the oldest went

        sources[2].unlink()
        _new_process(monkeypatch)
        surface._self_attributes(_import_file(sources[3]).Holder3)
        assert _cached_files(tmp_path) == [str(sources[1]), str(sources[3])]  # the removed file went
    finally:
        surface._self_attributes.cache_clear()
        for path in sources:
            sys.modules.pop(path.stem, None)


@pytest.mark.sglang
def test_each_scheduler_option_is_honoured_or_refused():
    """SGLang's scheduler options (its ``schedule`` group and ``pp_*``) are each classified: an
    option only SGLang's PP loop reads would be silently ignored by the VPP loop."""
    arg_utils = pytest.importorskip("sglang.srt.arg_groups.arg_utils")
    from sglang.srt.server_args import ServerArgs

    groups = arg_utils.namespace_of(ServerArgs)
    relevant = {name for name, path in groups.items()
                if path.split(".")[0] == "schedule" or (path.split(".")[0] == "parallel" and name.startswith("pp_"))}
    unclassified = sorted(relevant - set(SCHEDULER_OPTIONS))
    assert not unclassified, f"classify in validate.SCHEDULER_OPTIONS (honour or refuse): {unclassified}"
    refused = {refusal.attr for refusal in VPP_REFUSALS}
    assert {"pp_async_batch_depth", "enable_mixed_chunk", "enable_dynamic_chunking"} <= refused
    stale = sorted(set(SCHEDULER_OPTIONS) - set(groups))
    assert not stale, f"not ServerArgs options of this SGLang: {stale}"


def test_comm_timeout_precedence_is_flag_then_env_then_default(monkeypatch):
    from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args

    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    monkeypatch.delenv(COMM_TIMEOUT_ENV, raising=False)
    assert PipelineOptions.from_namespace(parser.parse_args([])).vpp_comm_timeout == DEFAULT_COMM_TIMEOUT_S
    monkeypatch.setenv(COMM_TIMEOUT_ENV, "8")
    assert PipelineOptions.from_namespace(parser.parse_args([])).vpp_comm_timeout == 8.0
    assert PipelineOptions.from_namespace(parser.parse_args(["--vpp-comm-timeout", "5"])).vpp_comm_timeout == 5.0
    monkeypatch.setenv(COMM_TIMEOUT_ENV, "soon")
    with pytest.raises(PpModeError, match=f"{COMM_TIMEOUT_ENV}='soon' is not a number"):
        PipelineOptions.from_namespace(parser.parse_args([]))


@pytest.mark.parametrize("mode", ["cpp", "vpp-pack"])
@pytest.mark.parametrize("flag,env", [("nan", None), ("inf", None), ("1e300", None), ("0", None), ("-1", None),
                                      (None, "nan"), (None, "inf"), (None, "-5")])
def test_a_comm_timeout_that_no_wait_can_take_is_refused_at_launch(monkeypatch, mode, flag, env):
    """NaN passes a ``<= 0`` test and would reach the scheduler's comm config; inf and 1e300
    overflow ``timedelta`` there; cpp and dcpp read the same value for their stock loop watchdog."""
    from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args, check_namespace

    parser = argparse.ArgumentParser()
    parser.add_argument("--pp-size", type=int, default=2)
    parser.add_argument("--chunked-prefill-size", type=int, default=512)
    add_pipeline_args(parser)
    parser.set_defaults(**{refusal.attr: None for refusal in VPP_REFUSALS})
    monkeypatch.delenv(COMM_TIMEOUT_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(COMM_TIMEOUT_ENV, env)
    argv = ["--pp-mode", mode] + ([] if flag is None else ["--vpp-comm-timeout", flag])
    given = f"--vpp-comm-timeout {float(flag)}" if flag is not None else f"{COMM_TIMEOUT_ENV}={env!r}"
    with pytest.raises(PpModeError, match=re.escape(f"{given} must be a number of seconds in (0, 604800]")):
        check_namespace(parser.parse_args(argv))


class _DropsItsDict:
    """A ServerArgs whose pickling lost the underscore attributes."""

    def __reduce__(self):
        return (_DropsItsDict, ())


def test_options_that_would_not_reach_the_schedulers_are_refused(monkeypatch):
    record = argparse.Namespace()
    attach(record, PipelineOptions(pp_mode="vpp"))
    check_options_travel(record)
    lossy = _DropsItsDict()
    attach(lossy, PipelineOptions(pp_mode="vpp"))
    with pytest.raises(PpModeError, match=f"does not carry {OPTIONS_ATTR}"):
        check_options_travel(lossy)
    monkeypatch.setenv(EXPECTED_MODE_ENV, "vpp-pack")
    with pytest.raises(PpModeError, match="parsed --pp-mode vpp-pack but this scheduler process received no"):
        check_options_reached(argparse.Namespace())
    check_options_reached(_with(PipelineOptions(pp_mode="vpp-pack")))
    monkeypatch.delenv(EXPECTED_MODE_ENV)
    check_options_reached(argparse.Namespace())  # sglang.Engine(...): no launcher parsed flags


def _with(options: PipelineOptions) -> argparse.Namespace:
    record = argparse.Namespace()
    attach(record, options)
    return record


def test_a_plugin_that_cannot_load_fails_loudly(monkeypatch, caplog, capsys):
    from sglang_vpp.sglang_plugin import entry

    monkeypatch.delenv(EXPECTED_MODE_ENV, raising=False)
    with pytest.raises(SystemExit) as info:
        entry.cannot_load("SGLang 0.5.99 found", ["--model-path", "m", "--pp-mode=vpp", "--vpp-trace", "t"])
    message = capsys.readouterr().err
    assert info.value.code == 2 and message.count("\n") == 1
    assert "--pp-mode, --vpp-trace cannot be served: SGLang 0.5.99 found" in message
    with caplog.at_level("WARNING"):
        entry.cannot_load("SGLang 0.5.99 found", ["--model-path", "m", "--pp-size", "2"])
    lines = [r.getMessage() for r in caplog.records if "sglang-vpp" in r.getMessage()]
    assert len(lines) == 1 and all(w in lines[0] for w in ("input guard", "failure report", "watchdog"))
    monkeypatch.setenv(EXPECTED_MODE_ENV, "vpp")  # a scheduler of a launcher that parsed --pp-mode vpp
    with pytest.raises(SystemExit):
        entry.cannot_load("SGLang 0.5.99 found", [])
    assert "--pp-mode vpp (from the launcher) cannot be served" in capsys.readouterr().err


def test_the_scopes_of_a_command_line():
    from sglang_vpp.sglang_plugin.cli_args import scopes_of_argv

    assert scopes_of_argv(["--pp-mode", "vpp-pack", "--pp-size", "2"], False) == (Scope.EVERY_MODE, Scope.VPP)
    assert scopes_of_argv(["--pp-mode=dcpp", "--pipeline-parallel-size=2", "--vpp-trace", "t"], True) == (
        Scope.EVERY_MODE, Scope.GENERIC_CPU, Scope.DCPP, Scope.STOCK_TRACE, Scope.STOCK_WATCHDOG)
    assert scopes_of_argv(["--pp-mode", "nope"], False) == (Scope.EVERY_MODE,)


# ----------------------------------------------------------------------------- upgrade drill
_DRILL_PATCH = """
import sglang.srt.managers.scheduler as scheduler
import sglang.srt.managers.tokenizer_manager as tm
import sglang.srt.distributed.parallel_state as ps

# renamed: a private method the VPP loop calls
owner = next(k for k in scheduler.Scheduler.__mro__ if "_pp_prepare_tensor_dict" in vars(k))
owner._pp_prepare_tensors = owner._pp_prepare_tensor_dict
del owner._pp_prepare_tensor_dict
# signature changed: the abort path the failure report calls (every mode)
def _handle_abort_req(self, abort):
    pass
tm.TokenizerManager._handle_abort_req = _handle_abort_req
# removed: the PP group the fold-back view is installed on
del ps._PP
"""
_DRILL_NAMES = ("Scheduler._pp_prepare_tensor_dict is missing",
                "TokenizerManager._handle_abort_req takes (self, abort), the plugin needs (self, recv_obj, ...)",
                "parallel_state._PP is missing")


def _run(code: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.sglang
def test_upgrade_drill_start_up_checks_name_each_changed_name():
    """The launcher's and the scheduler process's checks, run on a patched SGLang (child process)."""
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    code = _DRILL_PATCH + textwrap.dedent("""
        import argparse
        from sglang_vpp.sglang_plugin.cli_args import check_surface
        from sglang_vpp.sglang_plugin.options import PipelineOptions
        from sglang_vpp.sglang_plugin.process_hooks import check_scheduler_surface
        for mode in ("vpp", "cpp"):
            for check in (lambda o: check_surface(argparse.Namespace(pp_size=2), o),
                          lambda o: check_scheduler_surface(o, 2, False)):
                try:
                    check(PipelineOptions(pp_mode=mode))
                    print(mode, "PASSED")
                except ValueError as exc:
                    print(mode, type(exc).__name__, exc)
    """)
    result = _run(code)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("vpp ", "cpp "))]
    assert len(lines) == 4, result.stdout + result.stderr
    for line in lines[:2]:
        assert all(name in line for name in _DRILL_NAMES), line
    for line in lines[2:]:  # stock cpp relies on the every-mode names only
        assert _DRILL_NAMES[1] in line and _DRILL_NAMES[0] not in line and _DRILL_NAMES[2] not in line, line
    assert "VppConfigError" in lines[1] and "PluginError" in lines[3]


@pytest.mark.sglang
@pytest.mark.slow
def test_upgrade_drill_a_real_launch_refuses_before_any_scheduler(tiny_model_dir):
    """``python -m sglang.launch_server --pp-mode vpp`` on the patched SGLang: one line naming
    each name, exit status 2, at argument parsing (no scheduler process, so no batch)."""
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    code = _DRILL_PATCH + textwrap.dedent("""
        import runpy, sys
        sys.argv = ["sglang.launch_server", *sys.argv[1:]]
        runpy.run_module("sglang.launch_server", run_name="__main__")
    """)
    result = _run(code, "--model-path", str(tiny_model_dir), "--device", "cpu", "--pp-size", "2",
                  "--pp-mode", "vpp", "--chunked-prefill-size", "64", "--port", "39117")
    errors = [line for line in result.stderr.splitlines() if "sglang-vpp: error:" in line]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(errors) == 1 and all(name in errors[0] for name in _DRILL_NAMES), errors
    assert "sglang::scheduler" not in result.stderr and "Load weight" not in result.stderr


@pytest.mark.sglang
def test_doctor_prints_each_declared_name_with_its_status(monkeypatch):
    pytest.importorskip("sglang.srt.plugins.hook_registry")
    import json

    from typer.testing import CliRunner

    from sglang_vpp.cli.app import app
    from sglang_vpp.sglang_plugin import surface

    result = CliRunner().invoke(app, ["doctor", "--sglang"])
    assert result.exit_code == 0, result.output
    assert f"relies on: {len(SURFACE)}, 0 not ok" in result.output
    ours = [line for line in result.output.splitlines() if line.startswith(("ok ", "FAIL", "    ", "SGLang names"))]
    assert len(ours) > len(SURFACE) and all(len(line) <= 80 for line in ours)  # (SGLang's import warnings aside)
    broken = (surface.SurfaceName("sglang.srt.managers.scheduler.Scheduler.no_such_method", Use.CALL, Scope.VPP),)
    monkeypatch.setattr(surface, "SURFACE", surface.SURFACE + broken)
    result = CliRunner().invoke(app, ["doctor", "--sglang", "--json"])
    rows = {row["name"]: row for row in json.loads(result.output)["names"]}
    assert result.exit_code == 1 and "is missing" in rows[broken[0].path]["problem"]
    assert rows["sglang.srt.runtime_context.publish"]["problem"] is None


@pytest.mark.sglang
def test_the_vpp_loop_accounts_for_all_of_the_stock_pp_loop_state():
    """The VPP loop sets up the slot state SGLang's ``init_pp_loop_state`` would (it never calls
    it): every attribute that method assigns is set by the VPP replica or is stock PP's own."""
    scheduler = pytest.importorskip("sglang.srt.managers.scheduler")
    import ast
    import inspect

    from sglang_vpp.sglang_plugin.vpp.replica import PP_LOOP_STATE

    tree = ast.parse(textwrap.dedent(inspect.getsource(scheduler.Scheduler.init_pp_loop_state)))
    assigned = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self"}
    assert assigned == set(PP_LOOP_STATE), "classify in vpp/replica.PP_LOOP_STATE: " + \
        f"new {sorted(assigned - set(PP_LOOP_STATE))}, gone {sorted(set(PP_LOOP_STATE) - assigned)}"


@pytest.mark.sglang
def test_sglang_never_decodes_a_prefill_only_running_batch():
    """The decode hold (vpp/decode_slots.py) relies on ``get_next_batch_to_run`` skipping the
    decode of a running batch flagged ``is_prefill_only``: an upgrade that drops the check
    would decode held requests in their prefill-only slot."""
    scheduler = pytest.importorskip("sglang.srt.managers.scheduler")
    import inspect

    source = inspect.getsource(scheduler.Scheduler.get_next_batch_to_run)
    assert "not running_batch.is_prefill_only" in source


@pytest.mark.sglang
@pytest.mark.parametrize("ids", [[3, 10], [-1], [1.5]])
def test_sglang_refuses_token_ids_logprob_outside_the_vocabulary_itself(ids):
    """The input guard leaves ``token_ids_logprob`` to SGLang's own check in the method it hooks;
    an upgrade that drops that check would let an out-of-vocabulary id crash the sampler."""
    tokenizer_manager = pytest.importorskip("sglang.srt.managers.tokenizer_manager")

    class Manager:
        class model_config:  # noqa: N801 - the attribute path TokenizerManager has
            vocab_size = 10

    class Request:
        token_ids_logprob = ids

    with pytest.raises(ValueError):
        tokenizer_manager.TokenizerManager._validate_token_ids_logprob(Manager(), Request())
    tokenizer_manager.TokenizerManager._validate_token_ids_logprob(Manager(), type("Ok", (), {"token_ids_logprob": [0, 9]})())
