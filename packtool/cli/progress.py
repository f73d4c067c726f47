"""Progress bars: tqdm on a terminal only, silent with --quiet or when stderr is piped."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from packtool.progress import Progress


@contextlib.contextmanager
def progress_bar(quiet: bool, desc: str, unit: str) -> Iterator[Progress | None]:
    """A `progress(done, total)` callback drawing a tqdm bar on a terminal (None with --quiet or when piped)."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit=unit, leave=False, file=sys.stderr)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()
