"""`--overwrite` may replace a token store, never anything else.

A directory is replaced only when it is empty or a committed packtool token store holding only
store files; never the file-system root, the home directory, a directory holding the current
directory, or one holding (or being) an input of the run. Everything else is refused with one
line, and nothing is deleted: packtool removes only what it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from packtool.errors import OutputExistsError
from packtool.formats.token_store import FORMAT_NAME, MANIFEST, foreign_files, is_token_store

_KEEP = "packtool only replaces a token store it wrote, choose another --output"


def check_replaceable(output: str | os.PathLike[str], protected: Sequence[str | os.PathLike[str]] = ()) -> None:
    """Raise OutputExistsError unless replacing the directory `output` can only lose a token store."""
    out = Path(output).expanduser().resolve()
    for item in protected:
        path = Path(item).expanduser().resolve()
        if path == out or out in path.parents:
            raise OutputExistsError(f"--output {out} holds the input {path}, refusing to replace it, {_KEEP}")
    if out == Path(out.anchor) or out == Path.home().resolve():
        raise OutputExistsError(
            f"--output {out} is the {'root' if out == Path(out.anchor) else 'home'} directory, {_KEEP}"
        )
    cwd = Path.cwd().resolve()
    if out == cwd or out in cwd.parents:
        raise OutputExistsError(f"--output {out} holds the current directory, refusing to replace it, {_KEEP}")
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputExistsError(f"--output {out} exists and is not a directory, {_KEEP}")
    if not any(out.iterdir()):
        return
    if not is_token_store(out):
        raise OutputExistsError(
            f"--output {out} is not a packtool token store (no {MANIFEST} with format {FORMAT_NAME}) "
            f"and is not empty, refusing to replace it, {_KEEP}"
        )
    extra = foreign_files(out)
    if extra:
        raise OutputExistsError(
            f"--output {out} is a token store but also holds {', '.join(extra[:3])}"
            f"{' ...' if len(extra) > 3 else ''}, refusing to replace it, move those out or choose another --output"
        )
