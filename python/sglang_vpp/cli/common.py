"""Shared CLI helpers: user errors to a clean message and exit code 2, one size syntax, range and
output-path checks done before any work starts, JSON out."""

from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import typer

from ..schedule.factory import fills_batches
from ..timeouts import MAX_TIMEOUT_S

__all__ = [
    "CliInputError",
    "FOLD_HELP",
    "BENCH_FILL_HELP",
    "FILL_DEFAULT",
    "FILL_HELP",
    "LAYOUT_FOLD_HELP",
    "MAX_REQUESTS",
    "at_least",
    "at_most",
    "check_output_path",
    "check_output_paths",
    "check_split_modes",
    "echo_wrapped",
    "folds_any",
    "emit_json",
    "given_flags",
    "layers_option",
    "not_blank",
    "output_option",
    "seed_option",
    "parse_fold_option",
    "parse_int_list",
    "parse_output_path",
    "parse_size_option",
    "png_path",
    "positive",
    "timeout_option",
    "user_errors",
]


class CliInputError(ValueError):
    """A bad command-line value; the message names the flag, the value and the fix."""


def user_errors(fn: Callable) -> Callable:
    """Turn ``ValueError`` (all our user-input errors) into ``error: ...`` and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValueError as error:
            typer.echo(f"error: {error}", err=True)
            raise typer.Exit(2) from None

    return wrapper


def given_flags(ctx: typer.Context, flags: dict[str, str]) -> list[str]:
    """The flags of ``flags`` (parameter name -> flag) the user gave, on the command line or
    through the environment: a default is never "given", even when the value is the default's."""
    return [flag for name, flag in flags.items()
            if ctx.get_parameter_source(name).name in ("COMMANDLINE", "ENVIRONMENT")]


def echo_wrapped(text: str, indent: str = "", err: bool = False) -> None:
    """Print ``text`` wrapped to 80 columns (a terminal's default width), continuation lines
    indented two more than ``indent``; words (and hyphenated names) are never split."""
    import textwrap

    typer.echo("\n".join(textwrap.wrap(text, 80, initial_indent=indent, subsequent_indent=indent + "  ",
                                        break_on_hyphens=False, break_long_words=False)), err=err)


def emit_json(data: Any, path: Path | None = None) -> None:
    """Write JSON to ``path``, or to stdout when ``path`` is None or ``-``."""
    text = json.dumps(data, indent=2)
    if path is None or str(path) == "-":
        sys.stdout.write(text + "\n")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def parse_int_list(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):  # an empty list would read as "not given": an even split the user did not ask for
        raise CliInputError(f"{what} {text!r} gives no count; give one per stage like 3,3,3,3, or drop {what}")
    if not all(parts):  # dropping it would shift every later count to another stage
        raise CliInputError(f"{what} {text!r} has an empty entry; give one count per stage like 3,3,3,3")
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers like 3,3,3,3, got {text!r}") from None


def check_split_modes(split: Sequence[int] | None, modes: str | Sequence[str], pp: int, fold: str) -> None:
    """One ``--split`` gives one layer count per stage of every mode it runs: modes whose layouts
    have different stage counts (cpp's P, vpp's 2P) admit no split in common, and a per-layout
    error would send the user from one count to the other and back."""
    if split is None:
        return
    from ..schedule import mode_stages

    by_count: dict[int, list[str]] = {}
    for mode, count in mode_stages(modes, pp, fold).items():
        by_count.setdefault(count, []).append(mode)
    if len(by_count) > 1:
        layouts = "; ".join(f"{', '.join(names)}: {count}" for count, names in sorted(by_count.items()))
        given = len(split)
        fits = (f"its {given} counts fit --modes {','.join(by_count[given])}" if given in by_count else
                f"e.g. --modes {','.join(by_count[min(by_count)])} with {min(by_count)} counts")
        raise CliInputError(f"--split {','.join(map(str, split))} gives one layer count per stage, but at --pp {pp} the "
                            f"modes lay out different stage counts ({layouts}): run the modes of one stage count per "
                            f"command ({fits}), or drop --split for an even split")


def folds_any(modes: str | Sequence[str], fold: str) -> bool:
    """Whether ``--fold fused`` changes a run of ``modes``: only the fold-back modes have a fold, so
    a title that says "fused fold" over cpp and dcpp alone would name a setting that moved nothing."""
    from ..schedule import LayoutKind, get_policy, parse_policies

    specs = parse_policies(modes) if isinstance(modes, str) else [get_policy(m) for m in modes]
    return fold == "fused" and any(spec.layout_kind is LayoutKind.FOLDBACK for spec in specs)


_FOLD_VALUES = ("Fold of the vpp modes: split (the method's: the last rank runs its two stages as two "
                "forwards) or fused (one forward over both: 2P-1 stages, so --split takes 2P-1 counts).")

FOLD_HELP = _FOLD_VALUES + " cpp and dcpp have no fold and ignore it."
"""The help of the ``--fold`` of the commands that run several modes (docs/cli.md)."""

_PARTIAL_FILL = ("A batch starts the request that overflows its chunk budget in what is left (a head; its rest "
                 "runs next, cut from the head's end), as SGLang's prefill adder does")

BENCH_FILL_HELP = (_PARTIAL_FILL + " (default with --batch-requests); --no-partial-fill: whole requests "
                   "only.")
"""``bench``'s ``--partial-fill/--no-partial-fill``: on wherever requests are batched, so that the
runtime's forwards are those of the SGLang it stands for and of ``simulate``'s default."""

FILL_DEFAULT = fills_batches(None, batching=True)
"""Whether ``simulate`` and the simulator grids of ``benchmarks/`` (``auto_sweep.grid_parser``),
which always batch, fill their batches unless told ``--no-partial-fill``: as the simulator
library and ``bench`` do when batching, on, so that their cpp and dcpp fill their forwards as the
SGLang they stand for does (whole requests only would understate them and overstate a fold-back
mode's lead on short and mixed loads)."""

FILL_HELP = _PARTIAL_FILL + (" (default)" if FILL_DEFAULT else "") + "; --no-partial-fill: whole requests only."
"""The help of the ``--partial-fill/--no-partial-fill`` whose default is ``FILL_DEFAULT``."""

LAYOUT_FOLD_HELP = _FOLD_VALUES + " cpp and dcpp have no fold: --fold fused with them is an error."
"""``layout``'s ``--fold``: its one layout has no mode to run as always, so the schedule core's
``build_layout`` refuses a fused fold of a contiguous layout."""


def parse_fold_option(text: str) -> str:
    """A ``--fold`` value, checked before any work starts."""
    from ..schedule import LayoutError, parse_fold

    try:
        return str(parse_fold(text))
    except LayoutError:
        raise CliInputError(f"--fold must be split or fused, got {text!r}") from None


def parse_size_option(text: str | int | None, flag: str) -> int | None:
    """The one size syntax of every token-count flag: ``512``, ``16k`` (16384), ``1m`` (1048576)."""
    if text is None:
        return None
    from ..schedule import parse_size
    from ..workload_file import MAX_TOKENS

    try:
        value = parse_size(text)
    except ValueError:
        raise CliInputError(f"{flag} {text!r} is not a size >= 1; write e.g. 512, 16k or 1m") from None
    # The workload file's bound: far beyond any context, and a larger count is a typo that would
    # have a command plan or generate without end.
    if value > MAX_TOKENS:
        raise CliInputError(f"{flag} {text!r} is {value} tokens, more than the most any size takes, "
                            f"{MAX_TOKENS} (16m)")
    return value


def at_least(value: float | int | None, minimum: float | int, flag: str) -> None:
    """Reject ``value < minimum``, NaN and infinity (None: the flag was not given)."""
    if value is not None and not value >= minimum:
        raise CliInputError(f"{flag} must be >= {minimum}, got {value}")
    if value is not None and not math.isfinite(value):
        raise CliInputError(f"{flag} must be a finite number, got {value}")


def at_most(value: float | int | None, maximum: float | int, flag: str, why: str) -> None:
    """Reject ``value > maximum`` (and NaN; None: the flag was not given); ``why`` follows the
    bound in the message, its unit and reason, e.g. ``"s (a week)"``."""
    if value is not None and not value <= maximum:
        most = f"{maximum:g}" if isinstance(maximum, float) else str(maximum)
        raise CliInputError(f"{flag} must be at most {most} {why}, got {value}")


MAX_REQUESTS = 100_000
"""The most requests (``bench-serve --num-requests``, ``--warmup``) one bench_serving pass sends:
a hundred times its default; it builds every prompt before sending the first, so a typo such as
10**12 would fill the memory or run for days."""

MAX_SEED = 2**32 - 1
"""The largest seed numpy takes (bench_serving seeds it with ``--seed``); the reference runtime's
torch generators take far larger, but one range serves both commands."""


def seed_option(value: int, flag: str = "--seed", offset: int = 0) -> None:
    """A seed in ``0..MAX_SEED`` once the command adds up to ``offset`` to it (bench-serve's
    repeats and warm-up): outside it the seeded library fails only after the work started."""
    most = MAX_SEED - offset
    if not 0 <= value <= most:
        added = f" (it adds up to {offset} for repeats and warm-up)" if offset else ""
        raise CliInputError(f"{flag} must be in 0..{most}{added}, got {value}")


def not_blank(value: str | None, flag: str, hint: str) -> None:
    """Reject a text option given as an empty or blank string (None: not given). Left through, ''
    reads as "not given" and runs the default, or reaches a subprocess as a meaningless argument."""
    if value is not None and not value.strip():
        raise CliInputError(f"{flag} {value!r} is empty; {hint}")


def layers_option(value: int, flag: str = "--layers") -> None:
    """A decoder layer count: at least 1 and at most what a model preset may hold
    (``sim/physical_ranges.PHYSICAL_RANGES``), so that a typo cannot ask for a billion stages."""
    from ..sim.physical_ranges import PHYSICAL_RANGES

    layers = PHYSICAL_RANGES["models"]["num_layers"]
    at_least(value, int(layers.low), flag)
    at_most(value, int(layers.high), flag, "(the most layers a model takes)")


def timeout_option(value: float, flag: str) -> None:
    """Reject a timeout that is not > 0 or longer than ``MAX_TIMEOUT_S``."""
    positive(value, flag)
    at_most(value, MAX_TIMEOUT_S, flag, "s (a week)")


def positive(value: float | None, flag: str) -> None:
    """Reject ``value <= 0`` (and NaN)."""
    if value is not None and not value > 0:
        raise CliInputError(f"{flag} must be > 0, got {value}")


def parse_output_path(text: str) -> Path:
    """The ``parser`` of every flag that names a file to write (``--json``, ``--trace``, ``--plot``,
    ``--costs``, ``--output-file``): a name that can only be a directory's (``outd/``, ``outd/.``)
    is refused while the command line is read. ``Path`` drops the trailing separator, so past
    this point ``outd/`` reads as a file ``outd``, which the run would create at its end.

    An existing directory named without one is refused by ``check_output_path``, and a missing
    parent folder is made, by the probe there and by each writer."""
    import os

    if not text:
        raise typer.BadParameter("give a file name")
    last = text.replace(os.altsep, os.sep) if os.altsep else text
    if text != "-" and last.rsplit(os.sep, 1)[-1] in ("", ".", ".."):
        raise typer.BadParameter(f"{text!r} names a directory; give a file name inside it")
    path = Path(text)
    # ``./-`` names a file called '-', but Path reads it as '-', which means stdout.
    return Path.cwd() / path if text != "-" and str(path) == "-" else path


def output_option(*flags: str, help: str) -> Any:
    """A typer option naming a file to write, unset by default: every such flag reads its value
    with ``parse_output_path`` and shows ``<path>`` in ``--help``, so they cannot drift apart."""
    return typer.Option(None, *flags, parser=parse_output_path, metavar="<path>", help=help)


def check_output_path(path: Path | None, flag: str, stdout: bool = False) -> None:
    """Fail before the work if an output file could not be written afterwards; '-' is stdout
    where ``stdout`` (``--json -``), else refused (a trace, plot or cost file is not text to print).

    The file is created (with any missing folders) and removed again: permission bits say
    nothing for root, nor for /proc or a read-only mount, where only a real write tells."""
    if path is None:
        return
    if str(path) == "-":
        if stdout:
            return
        raise CliInputError(f"{flag} '-': only --json writes to stdout; give a file name")
    if path.is_dir():
        raise CliInputError(f"{flag} {str(path)!r} is a directory; give a file name inside it")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise CliInputError(f"{flag} {str(path)!r}: {str(parent)!r} is a file, not a directory")
    existed = path.exists()
    made = [d for d in reversed(path.parents) if not d.exists()]
    try:
        for folder in made:
            folder.mkdir()
        with path.open("a"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise CliInputError(f"{flag} {str(path)!r} cannot be written ({reason}); choose another path") from None
    finally:
        if not existed and path.is_file():
            path.unlink()
        for folder in reversed(made):
            if folder.is_dir():
                folder.rmdir()


def check_output_paths(*outputs: tuple[Path | None, str] | tuple[Path | None, str, Sequence[tuple[Path, str]]],
                       inputs: Sequence[tuple[Path | str | None, str]] = ()) -> None:
    """``check_output_path`` for each ``(path, flag)`` (``--json`` may be '-'), and no two outputs
    naming one file: each is written after the run, the later replacing the earlier. A third item
    lists the files a flag also writes next to its path, as ``(path, what)`` (e.g. ``--costs``'s
    per-mode samples): another flag naming one of those would be overwritten as silently.
    ``inputs`` are the files the command reads, as ``(path, flag)``: an output naming one would
    overwrite (``--output-file``: append to) measured costs or a workload with the results."""
    read = {Path(path).resolve(): flag for path, flag in inputs if path is not None and Path(path).is_file()}
    written: dict[Path, str] = {}
    for path, flag, *also in outputs:
        check_output_path(path, flag, stdout=flag == "--json")
        if path is None or str(path) == "-":
            continue
        for target, what in [(path, flag), *(also[0] if also else ())]:
            key = target.resolve()
            if key in read:
                raise CliInputError(f"{what} names {str(target)!r}, the file {read[key]} reads: the output would be "
                                    "written into it; give the output another file")
            if key in written:
                raise CliInputError(f"{written[key]} and {what} both name {str(target)!r}, and the later output "
                                    "would replace the earlier; give each its own file")
            written[key] = what


def png_path(path: Path | None) -> Path | None:
    """A ``--plot`` path as matplotlib writes it: ``out`` becomes ``out.png`` (a directory or
    ``-`` stays as given, for ``check_output_path`` to refuse, rather than become a file). A
    suffix matplotlib writes no format for is refused here: matplotlib refuses it only when the
    plot is saved, after the whole run. A name ending in a dot has an empty suffix, which
    ``Path.suffix`` reads as none (``out.`` would become ``out..png``): refused as unclear."""
    if path is None or path.is_dir() or str(path) == "-":
        return path
    if path.name.endswith("."):
        raise CliInputError(f"--plot {str(path)!r}: empty file suffix; end the name in .png, .svg or .pdf, or "
                            "drop the dot for .png")
    if not path.suffix:
        return path.with_name(path.name + ".png")
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise CliInputError(f"--plot {str(path)!r}: matplotlib writes no {path.suffix} files; end the name in "
                            ".png, .svg or .pdf, or drop the suffix for .png")
    return path
