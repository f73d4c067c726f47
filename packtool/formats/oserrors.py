"""Operating-system errors (permissions, disk full, I/O errors) as one-line PacktoolErrors.

Stages wrap their reads of an input in `reading(path)` and their whole write phase in
`writing(output)`: an OSError there is the user's environment, not a bug, so it becomes an
`InputError` / `StorageError` that names the file, the reason and the fix. Anything else keeps
its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from packtool.errors import InputError, StorageError

_WRITE_HINTS = {
    errno.ENOSPC: "free disk space or choose another --output",
    errno.EDQUOT: "free space in your quota or choose another --output",
    errno.EFBIG: "the file system or a limit (ulimit -f) caps the file size, choose another --output",
    errno.EROFS: "the file system is read-only, choose another --output",
    errno.EACCES: "check the directory's permissions or choose another --output",
    errno.EPERM: "check the directory's permissions or choose another --output",
}


def os_reason(exc: OSError) -> str:
    """`strerror` (`[Errno 28] No space left on device` -> `No space left on device`)."""
    return exc.strerror or str(exc) or type(exc).__name__


@contextlib.contextmanager
def reading(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OSError while reading the input `path` into an InputError naming it."""
    try:
        yield
    except OSError as exc:
        raise InputError(
            f"cannot read the input ({os_reason(exc)})",
            str(exc.filename) if exc.filename is not None else os.fspath(path),
            hint="check that it is readable (permissions, disk) and complete",
        ) from exc


@contextlib.contextmanager
def writing(output: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OSError while writing `output` (or its hidden siblings) into a StorageError naming the file."""
    try:
        yield
    except OSError as exc:
        raise StorageError(write_error_message(exc, output)) from exc


def write_error_message(exc: OSError, output: str | os.PathLike[str]) -> str:
    where = exc.filename if exc.filename is not None else Path(output)
    hint = _WRITE_HINTS.get(exc.errno or 0, "check the output path, its permissions and free space")
    return f"cannot write the output ({os_reason(exc)}), {os.fspath(where)}, {hint}"
