"""The command line: typer commands and the `packtool run` YAML, both built on the stages' configs.

The only layer that prints, exits or draws progress bars.
"""

from __future__ import annotations

import sys

import typer

from packtool.cli.commands import app
from packtool.errors import PacktoolError


def main() -> None:
    """Console entry point: typer handles usage errors (exit 2); PacktoolError becomes one line, exit 1."""
    try:
        app()
    except PacktoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)


__all__ = ["app", "main"]
