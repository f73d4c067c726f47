"""Deferring SIGINT/SIGTERM for a block: around compiled code and around renames that must not be split.

Python runs signal handlers only between bytecodes, so a kernel is never interrupted anyway; but a
handler that raises (Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM) while numba boxes a kernel's
return values can crash the interpreter (SIGSEGV, numba issue 2324; seen here in `plan_layout`).
Blocking the two signals for the call and unblocking right after delivers them at the next
bytecode instead: no added delay, no crash. The same deferral keeps the two renames of a store swap
together (the signal is delivered right after the second).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
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
