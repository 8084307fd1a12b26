"""The ``sglang-vpp`` Typer application.

Each command lives in its own module and is registered here by name. Command modules keep
their heavy imports (torch, matplotlib, sglang) inside the command function so that
``sglang-vpp --help`` and the schedule commands stay fast.
"""

from __future__ import annotations

import importlib

import typer


def _wrap_help_at_spaces_only() -> None:
    """Rich's help table cuts long option names at 80 columns (``--chunked-prefill…``), so the
    app uses click's plain help, which keeps every name whole. Its text wrapper would break
    hyphenated names in the help text (``--pp-`` / ``mode``, ``vpp-`` / ``pack``); this makes it
    wrap at spaces only. The click that formats Typer's help is the copy Typer ships
    (``typer._click``); ``wrap_text`` looks the wrapper class up at each call. Without that
    module (another Typer) the help still keeps names whole, only wrapped at hyphens too."""
    try:
        from typer._click import _textwrap
    except ImportError:
        return
    base = _textwrap.TextWrapper

    class SpaceWrapper(base):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "break_on_hyphens": False})

    _textwrap.TextWrapper = SpaceWrapper


_wrap_help_at_spaces_only()

app = typer.Typer(
    name="sglang-vpp",
    help="Virtual Pipeline Parallelism for chunked prefill: plan, check, simulate and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# (command name, module, function). The names are a public contract (tests/cli/test_cli_surface.py).
COMMANDS: list[tuple[str, str, str]] = [
    ("layout", "sglang_vpp.cli.layout_cmd", "layout"),
    ("schedule", "sglang_vpp.cli.schedule_cmd", "schedule"),
    ("check", "sglang_vpp.cli.check_cmd", "check"),
    ("simulate", "sglang_vpp.cli.simulate_cmd", "simulate"),
    ("bench", "sglang_vpp.cli.bench_cmd", "bench"),
    ("bench-serve", "sglang_vpp.cli.bench_serve_cmd", "bench_serve"),
    ("doctor", "sglang_vpp.cli.doctor_cmd", "doctor"),
]



def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        from sglang_vpp import __version__

        try:
            sglang = version("sglang")
        except PackageNotFoundError:
            sglang = "not installed"
        typer.echo(f"sglang-vpp {__version__} (SGLang {sglang})")
        raise typer.Exit(0)


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the version (and SGLang's) and exit."),
) -> None:
    """Virtual Pipeline Parallelism for chunked prefill: plan, check, simulate and benchmark."""


for _name, _module, _attr in COMMANDS:
    app.command(_name)(getattr(importlib.import_module(_module), _attr))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
