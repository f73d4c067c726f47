"""The command line: typer commands and the `packtool run` YAML, both built on the stages' configs.

The only layer that prints, exits or draws progress bars.
"""

from __future__ import annotations

import signal
import sys

import typer

from packtool.cli.commands import app
from packtool.cli.summaries import error_line
from packtool.errors import PacktoolError, UsageError


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that it unwinds like Ctrl-C: staging removed, workers stopped.

    Not a KeyboardInterrupt: typer turns that into a silent exit 130 before `main` sees it.
    """


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
    raise Terminated()


def main() -> None:
    """Console entry point: a usage error of the parser (click) or of a config is one line, exit 2 (`usage.py`);
    any other PacktoolError is one line, exit 1.

    SIGTERM unwinds every writer like Ctrl-C (nothing half-written stays under a final name, worker
    processes are stopped) and ends with one line, exit 143; a re-run resumes.
    """
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(prog_name="packtool", standalone_mode=False)  # parser errors: one line, exit 2 (cli/help.py)
        if isinstance(code, int) and code:  # `typer.Exit(n)` and Ctrl-C (130) come back as the code
            sys.exit(code)
    except typer.Abort:  # end of input at a prompt
        typer.echo("error: aborted, no input was given, run the command again", err=True)
        sys.exit(1)
    except PacktoolError as exc:
        typer.echo(error_line(str(exc)), err=True)
        sys.exit(2 if isinstance(exc, UsageError) else 1)
    except Terminated:
        typer.echo(
            "error: terminated (SIGTERM), nothing half-written was kept, re-run the same command to resume", err=True
        )
        sys.exit(143)
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = ["app", "main"]
