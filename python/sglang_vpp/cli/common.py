"""Shared CLI helpers: user errors to a clean message and exit code 2, size parsing, JSON out."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable

import typer

__all__ = ["user_errors", "emit_json", "parse_int_list"]


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
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated integers like 3,3,3,3, got {text!r}") from None
