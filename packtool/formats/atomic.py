"""Atomic outputs: nothing half-written is ever left under a final name.

Files are written to a hidden sibling (`.NAME.tmp-PID`), flushed, fsynced and renamed.
Whole stores are built in a hidden sibling directory and renamed into place; a store that
already exists is moved aside first and removed only after the new one is in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from packtool.formats.faults import fault_point
from packtool.signals import signals_deferred


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
def directories_made(path: Path, make: Callable[[Path], object] | None = None) -> Iterator[Path]:
    """Create the directory `path` with its missing parents (`make(path)`, default `mkdir -p`); when the block
    fails, remove again the ones made here that are still empty (deepest first), so a failed run leaves no
    skeleton of empty directories. A directory something else wrote into meanwhile (`.DIR.partial`) stays."""
    made = []
    for directory in (path, *path.parents):
        if directory.exists():
            break
        made.append(directory)
    try:
        if make is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            make(path)
        yield path
    except BaseException:
        for directory in made:
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


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
        try:
            fh.close()  # flushes what is buffered: on a full disk it fails again
        finally:
            tmp.unlink(missing_ok=True)  # so the temp goes whatever close() did (a full disk left it behind)
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
        replace_directory(staging, final_path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`, glibc >= 2.28).

    False where the call or the file system does not support it (the caller falls back to two renames).
    """
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


def replace_directory(staging: Path, final: Path) -> None:
    """Put `staging` in place of `final`; the previous `final` is removed once the new one is in place.

    Where the file system can, the two directories are exchanged in ONE atomic rename (`exchange`):
    `final` always names a complete store, even under SIGKILL. Elsewhere `final` is moved aside
    and `staging` renamed in, with SIGINT/SIGTERM deferred and an exception between the renames
    putting the old directory back; a SIGKILL there leaves `final` missing until
    `recover_directory` repairs it on the next run. The retired copy is removed in a `finally`, so
    a Ctrl-C or SIGTERM delivered right after the swap leaves nothing behind.
    """
    old = temp_sibling(final, "old")
    retired: Path | None = None
    try:
        with signals_deferred():  # a deferred signal is raised when this block exits: after the swap
            if final.exists() and exchange(staging, final):
                retired = staging  # the staging name now holds the old store
                fault_point("atomic.swap:exchanged")
            else:
                moved = False
                try:
                    if final.exists():
                        if old.exists():
                            shutil.rmtree(old)
                        fault_point("atomic.swap:rename-old")
                        os.replace(final, old)
                        moved = True
                    fault_point("atomic.swap:rename-new")
                    os.replace(staging, final)
                except BaseException:
                    if moved and not final.exists():
                        os.replace(old, final)
                    raise
                retired = old if moved else None
            fsync_dir(final.parent)
        fault_point("atomic.swap:remove-old")
    finally:
        if retired is not None and retired.exists():
            shutil.rmtree(retired)


def _pid_of(path: Path) -> int | None:
    pid = path.name.rsplit("-", 1)[-1]
    return int(pid) if pid.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (a pid of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dead_siblings(final: Path, tag: str) -> list[Path]:
    """`.NAME.TAG-PID` directories next to `final` whose process is gone, oldest first."""
    found = []
    for path in final.parent.glob(f".{final.name}.{tag}-*"):
        pid = _pid_of(path)
        if pid is not None and pid != os.getpid() and not pid_alive(pid) and path.is_dir():
            found.append(path)
    return sorted(found, key=lambda p: p.stat().st_mtime)


def recover_directory(final: str | os.PathLike[str], is_complete: Callable[[Path], bool]) -> str | None:
    """Repair what a killed `replace_directory` left next to `final`; call it under the output's lock.

    `final` missing: a complete staged new directory (killed between the two renames) is moved
    into place, else a complete moved-aside old one is put back. Then the leftover old copies of
    dead runs are removed (the staged ones are the caller's to clean). Returns what it did, or None.
    """
    final_path = Path(final)
    olds = dead_siblings(final_path, "old")
    done = None
    if not final_path.exists():
        staged = [p for p in dead_siblings(final_path, "tmp") if is_complete(p)]
        kept = [p for p in olds if is_complete(p)]
        if staged:
            os.replace(staged[-1], final_path)
            done = f"finished the swap of {final_path} that a killed run left ({staged[-1].name})"
        elif kept:
            os.replace(kept[-1], final_path)
            olds.remove(kept[-1])
            done = f"restored {final_path} from {kept[-1].name} that a killed run left"
        if done:
            fsync_dir(final_path.parent)
    if final_path.exists():
        for path in olds:
            shutil.rmtree(path, ignore_errors=True)
    return done
