"""The `packtool` command line: parse flags, build a config, call ONE library function, print.

Every `PacktoolError` becomes one line `error: ...` on stderr and exit code 1.
Progress bars (tqdm) live here only; the library reports progress through callbacks.
"""

from __future__ import annotations

import sys

import typer

from packtool import __version__
from packtool.errors import PacktoolError

app = typer.Typer(
    name="packtool",
    help="Tokenize raw LLM training data and bin-pack it into memory-mapped packs without padding waste.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packtool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """packtool: raw data -> token store -> pack store -> GPU batches."""


# ---- commands are added below, one short function each ----


def main() -> None:
    """Console entry point: run the app, turning PacktoolError into one line and exit 1."""
    try:
        app(standalone_mode=False)
    except PacktoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("error: interrupted, nothing was written under the final names, re-run the command", err=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
