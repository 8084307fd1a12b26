"""The docs stand alone and stay true to the code: every referenced repository file exists,
nothing points outside, and every flag a documented command line passes exists on that command."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import typer.main

from sglang_vpp.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")])
POINTERS = [*PAGES, ROOT / "pyproject.toml"]
# docs/x.md, benchmarks/y.py, tests/z.py anywhere in the text (backticks or not), and markdown
# link targets: whatever names a file of the repository.
_REFERENCE = re.compile(r"(?<![\w./-])((?:docs|benchmarks|scripts|tests)/[\w./-]*\w\.(?:md|py|sh|json|png|csv|toml))"
                        r"(?![\w-])|\]\(([^)#\s]+)\)")
# A documented command line: ``sglang-vpp CMD ...`` up to the end of the line (continued by a
# trailing backslash), a shell comment, a backtick or a table cell's bar.
_INVOCATION = re.compile(r"sglang-vpp ([a-z][a-z-]*)((?:[^\n`|#\\]|\\\n|\\(?!\n))*)")
_LAUNCH = re.compile(r"sglang\.launch_server((?:[^\n`|#\\]|\\\n|\\(?!\n))*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
_SERVER_ARG = re.compile(r"--server-arg[= ](--[a-z][\w-]*)")
"""``bench-serve --server-arg=--flag``: a server's flag, not bench-serve's."""


@pytest.mark.parametrize("page", POINTERS, ids=[p.name for p in POINTERS])
def test_page_links_stay_inside_the_repository(page):
    text = page.read_text()
    for outside in ("../shared", "shared/docs", "../../"):
        assert outside not in text, f"{page.name} refers outside the repository ({outside})"
    for match in _REFERENCE.finditer(text):
        target = match.group(1) or match.group(2)
        if "://" in target:
            continue
        base = ROOT if match.group(1) else page.parent
        path = (base / target).resolve()
        assert path.is_relative_to(ROOT), f"{page.name} links outside the repository: {target}"
        assert path.exists(), f"{page.name} refers to {target}, which does not exist"


def _cli_flags() -> dict[str, set[str]]:
    group = typer.main.get_command(app)
    return {name: {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            for name, command in group.commands.items()}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_flag_of_a_documented_command_line_exists(page):
    """``sglang-vpp CMD --flag`` in any page: CMD is a command and --flag one of its options;
    ``sglang.launch_server ... --pp-mode/--vpp-*``: the plugin adds that flag (SGLang's own
    flags are SGLang's to keep)."""
    from sglang_vpp.sglang_plugin.cli_args import add_pipeline_args

    flags = _cli_flags()
    parser = argparse.ArgumentParser()
    add_pipeline_args(parser)
    plugin = set(parser._option_string_actions)
    text = page.read_text()
    wrong = []
    for match in _INVOCATION.finditer(text):
        command = match.group(1)
        if command not in flags:
            wrong.append(f"sglang-vpp {command}: no such command")
            continue
        server = _SERVER_ARG.findall(match.group(2))
        wrong += [f"sglang-vpp {command} {flag}" for flag in _FLAG.findall(_SERVER_ARG.sub("--server-arg", match.group(2)))
                  if flag not in flags[command]]
        wrong += [f"launch_server {flag}" for flag in server if flag.startswith(("--vpp-", "--pp-mode")) and flag not in plugin]
    for match in _LAUNCH.finditer(text):
        wrong += [f"launch_server {flag}" for flag in _FLAG.findall(match.group(1))
                  if flag.startswith(("--vpp-", "--pp-mode")) and flag not in plugin]
    assert not wrong, f"{page.name} names what does not exist: {wrong}"
