"""One writer per output: `exclusive_output(path)` holds a lock for a whole run.

The lock is `flock(2)` on a hidden sibling `.NAME.lock`, so the kernel drops it when the holder
dies (SIGKILL included): a lock of a dead process is taken over with no stale-pid guessing.
The holder writes `{pid, host, started}` into the file so that the loser's one-line error says
who holds it. The lock file is removed on release (safely: a run that opened the file just
before it was unlinked notices the inode change and retries on the new file).

Re-entrant within one process (a run that locks the same output twice does not deadlock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from packtool.errors import OutputLockedError
from packtool.formats import jsontext

_HELD: dict[Path, int] = {}
_HELD_LOCK = threading.Lock()


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file guarding `path` (a file or a directory): `.NAME.lock` beside it."""
    p = Path(path).absolute()
    return p.with_name(f".{p.name}.lock")


def _holder(lock: Path) -> str:
    """'pid 123 on host x since 2026-01-01T00:00:00Z' from the lock file, best effort."""
    try:
        info = jsontext.loads(lock.read_text("utf-8"))
        return f"pid {info['pid']} on host {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that is still starting"


def _acquire(lock: Path, what: Path) -> int:
    """Open and flock `lock` (non-blocking); return the fd. Retries when the file was unlinked under us."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputLockedError(
                    f"{what} is being written by another packtool run ({_holder(lock)}; lock {lock}), "
                    "wait for it to finish or write to another output"
                ) from None
            raise OutputLockedError(
                f"cannot lock {what} ({exc.strerror}; lock {lock}), use an output on a file system with file locks"
            ) from exc
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(info).encode())
            return fd
        os.close(fd)  # the holder released and unlinked it between our open and flock: try the new file
    raise OutputLockedError(f"cannot take the lock {lock} (it keeps changing), {what}, retry")


@contextlib.contextmanager
def exclusive_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold the write lock of `path` for the block; OutputLockedError (one line, names the holder) if taken.

    Yields the lock file's path. Nothing is written to `path` itself.
    """
    lock = lock_path(path)
    with _HELD_LOCK:
        if lock in _HELD:
            _HELD[lock] += 1
            fd = -1
        else:
            fd = _acquire(lock, Path(path))
            _HELD[lock] = 1
    try:
        yield lock
    finally:
        with _HELD_LOCK:
            _HELD[lock] -= 1
            if _HELD[lock] == 0:
                del _HELD[lock]
                if fd >= 0:
                    with contextlib.suppress(FileNotFoundError):
                        lock.unlink()
                    os.close(fd)
