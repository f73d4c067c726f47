"""The one contract between a stage and an executor."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

R_co = TypeVar("R_co", covariant=True)


class Task(Protocol[R_co]):
    """A self-contained, picklable, idempotent unit of work."""

    def run(self) -> R_co: ...


Executor = Callable[[Sequence[Any]], Iterator[Any]]
"""`execute(tasks)` yields each task's `run()` result. packtool's executors yield them in task order
(a stage that writes results in order then holds few in memory), but a stage must not need that for
correctness: results carry their index."""
