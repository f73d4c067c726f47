"""Fault injection for the writers: named points where a test can interrupt a run.

Every writer calls `fault_point("stage.step:detail")` before and after each file, each rename
and the metadata/manifest line. Nothing happens unless the environment variable
`PACKTOOL_FAULT` is set (it is read at each call, costing one dict lookup):

    PACKTOOL_FAULT=raise:NAME     raise KeyboardInterrupt at NAME (what Ctrl-C does)
    PACKTOOL_FAULT=oserror:NAME   raise OSError(EIO) at NAME (a failing disk)
    PACKTOOL_FAULT=term:NAME      send SIGTERM to this process at NAME
    PACKTOOL_FAULT=kill:NAME      SIGKILL this process at NAME (no cleanup at all)
    PACKTOOL_FAULT=record:FILE    append every point name reached to FILE (one per line)

NAME matches a point exactly; a point fires once per process (so clean-up code that passes the
same point again, e.g. after an interrupt, runs unhindered; `reset()` re-arms). Tests enumerate the points of a command by running it once
with `record:`, so a new writer step cannot escape the fault tests.
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "PACKTOOL_FAULT"
MODES = ("raise", "oserror", "term", "kill", "record")
_FIRED: set[str] = set()


def reset() -> None:
    """Re-arm every point (for tests that inject faults in-process more than once)."""
    _FIRED.clear()


def fault_point(name: str) -> None:
    """A named point in a writer; a no-op unless `PACKTOOL_FAULT` selects it."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    mode, _, target = spec.partition(":")
    if mode == "record":
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")
        return
    if target != name or spec in _FIRED:
        return
    _FIRED.add(spec)
    if mode == "raise":
        raise KeyboardInterrupt(f"fault injected at {name}")
    if mode == "oserror":
        raise OSError(errno.EIO, f"fault injected at {name}")
    if mode == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
