"""Start loading the fast engine at the very start of a run, before the run's own imports.

fastokens builds its BPE from tokenizer.json in ~0.6 s (100k vocabulary; ~1 s at 150k) of one core,
without the GIL, and every chunk waits for it: it is the longest step before the first chunk. The
run's own imports (numpy, `tokenizers`, jinja2, the pipeline: ~0.15-0.2 s of the other core) used to
come first; now `tokenize_corpus` starts the load, then imports. This module is light for that
reason (no numpy, no `tokenizers`): the lookup of the file and a thread. A failure here is silent:
the run's own load (`backend_choice.fast_backend`) meets it again and reports it.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packtool.choices import BackendName
from packtool.errors import PacktoolError
from packtool.stages.tokenize.locate import locate

_LOCK = threading.Lock()
_LOADS: dict[tuple[str, int, int], Future[Any]] = {}


def load_key(path: str | Path) -> tuple[str, int, int]:
    """Which file a load is of: its path and, so that a file rewritten in between is loaded again, its mtime and size."""
    stat = os.stat(path)
    return str(path), stat.st_mtime_ns, stat.st_size


def start_fast_load(tokenizer: str, backend: str) -> None:
    """Begin `fastokens.Tokenizer.from_file` of the run's tokenizer.json in a thread when the run may use it."""
    if backend not in (BackendName.AUTO, BackendName.FAST) or importlib.util.find_spec("fastokens") is None:
        return
    try:
        path = locate(tokenizer)[0].resolve()
        key = load_key(path)
    except (PacktoolError, OSError):
        return
    with _LOCK:
        if key in _LOADS:
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-early")
        _LOADS[key] = pool.submit(_load, str(path))
        pool.shutdown(wait=False)


def take_fast_load(key: tuple[str, int, int]) -> Future[Any] | None:
    """The load started for `key` (`load_key`), handed over once: the caller keeps the engine."""
    with _LOCK:
        return _LOADS.pop(key, None)


def drop_fast_load(tokenizer: str) -> None:
    """Forget a load nobody took (the run failed before it needed the engine): a long-lived process keeps nothing."""
    with _LOCK:
        if not _LOADS:
            return
    try:
        key = load_key(locate(tokenizer)[0].resolve())
    except (PacktoolError, OSError):
        return
    take_fast_load(key)


def _load(path: str) -> Any:
    import fastokens

    return fastokens.Tokenizer.from_file(path)
