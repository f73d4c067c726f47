"""Signals around compiled code: hold SIGINT/SIGTERM back while a numba kernel runs in this thread.

Python runs signal handlers only between bytecodes, so a kernel is never interrupted anyway; but a
handler that raises (Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM) while numba boxes a kernel's
return values can crash the interpreter (SIGSEGV, numba issue 2324; seen here in `plan_layout`).
Blocking the two signals for the call and unblocking right after delivers them at the next
bytecode instead: no added delay, no crash.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def native_section() -> Iterator[None]:
    """Defer SIGINT/SIGTERM in this thread for the block (a no-op where signal masks are unsupported)."""
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - no pthread_sigmask here
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
