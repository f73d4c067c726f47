"""The trainers' own readers run in their own venv (`make interop`). A run whose `-m` expression selects no
interop test (`make test`: "not gpu and not slow and not interop") does not collect this folder at all:
its modules skip themselves at import when a trainer is absent, and those skips were listed by every
`make test` although no test of theirs was selected."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

#: markers an interop test may carry beside `interop` (pyproject.toml's list)
_OTHER_MARKERS = ("slow", "gpu", "ray")


def _selects_interop(expression: str) -> bool:
    """Whether `-m expression` can select a test marked `interop` (whatever else it is marked with)."""
    try:
        from _pytest.mark.expression import Expression

        compiled = Expression.compile(expression)
    except Exception:  # pytest's own parser reports a bad expression: collect as before
        return True
    for extra in itertools.product((False, True), repeat=len(_OTHER_MARKERS)):
        marked = {"interop", *(m for m, on in zip(_OTHER_MARKERS, extra, strict=True) if on)}
        try:
            if compiled.evaluate(lambda name, marked=marked, **_: name in marked):
                return True
        except Exception:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    expression = config.getoption("markexpr") or ""
    if expression and not _selects_interop(expression):
        return True
    return None
