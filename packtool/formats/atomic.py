"""Atomic outputs: nothing half-written is ever left under a final name.

Files are written to a hidden sibling (`.NAME.tmp-PID`), flushed, fsynced and renamed.
Whole stores are built in a hidden sibling directory and renamed into place; a store that
already exists is moved aside first and removed only after the new one is in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def temp_sibling(path: Path, tag: str = "tmp") -> Path:
    """A hidden name next to `path` that no reader mistakes for the real thing."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[object]:
    """Open a temporary sibling for writing; rename it to `path` only on success."""
    final = Path(path)
    tmp = temp_sibling(final)
    fh = open(tmp, mode)  # noqa: SIM115 - closed below on both paths
    try:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        fh.close()
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a small file in one atomic step."""
    with atomic_file(path, "wb") as fh:
        fh.write(data)  # type: ignore[attr-defined]


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty hidden staging directory; on success it replaces `final` whole.

    On any exception (KeyboardInterrupt and SIGTERM-raised SystemExit included) the
    staging directory is removed and `final` is left exactly as it was.
    """
    final_path = Path(final)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    staging = temp_sibling(final_path)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_directory(staging, final_path)


def replace_directory(staging: Path, final: Path) -> None:
    """Rename `staging` to `final`, moving an existing `final` aside and removing it after."""
    old = temp_sibling(final, "old")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)
