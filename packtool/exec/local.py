"""Local executors: a thread pool (for GIL-free kernels) and a spawn process pool.

Threads suit work whose hot loop releases the GIL (numba `nogil` kernels, Rust tokenizers):
no pickling, no process start-up, one copy of a large object (a 150k-vocabulary tokenizer takes
~1 s to load) shared by every task. Processes suit work that holds the GIL throughout.

Both yield results in task order. With `ahead`, at most that many tasks past the oldest one not
yet yielded are started, so a consumer that writes results in order holds at most `ahead` of
them in memory whatever the order in which they finish.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from packtool.exec.task import Executor

_M_ARENA_MAX = -8  # glibc mallopt parameter


@functools.cache
def cap_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for this process (once; a no-op elsewhere). True when applied.

    glibc gives each thread that allocates under contention an arena of its own and keeps freed
    blocks in it: threads passing large buffers between them (chunk reads, token ids) then hold
    RSS that is free but not returned. Measured on 1 GB through `packtool tokenize`: peak RSS
    545-865 MiB with the default (8 per core), 473 MiB with 2, at no CPU cost.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))


def thread_executor(
    workers: int, ahead: int | None = None, env: Callable[[int], Mapping[str, str]] | None = None
) -> Executor:
    """Tasks in a pool of `workers` threads (inline when one worker or one task), results in task order.

    `env(workers)` is set in the process environment while the tasks run (e.g. a Rust library's
    thread count, read when its thread pool starts) and restored after.
    """

    def execute(tasks: Sequence[Any]) -> Iterator[Any]:
        with scoped_environ(env(workers) if env else {}):
            if workers <= 1 or len(tasks) <= 1:
                for task in tasks:
                    yield task.run()
                return
            limit = max(workers, ahead) if ahead else len(tasks)
            cap_malloc_arenas()
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packtool") as pool:
                pending: deque[Future[Any]] = deque()
                todo = iter(tasks)
                try:
                    for task in todo:
                        pending.append(pool.submit(task.run))
                        if len(pending) >= limit:
                            break
                    while pending:
                        result = pending.popleft().result()
                        for task in todo:
                            pending.append(pool.submit(task.run))
                            break
                        yield result
                finally:
                    for future in pending:
                        future.cancel()

    return execute


def _run(task: Any) -> Any:
    return task.run()


def _init_worker(env: Mapping[str, str]) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool; a worker must not print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)


@contextlib.contextmanager
def scoped_environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` in the process environment for the duration, restoring the previous values after."""
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def process_executor(workers: int, worker_env: Callable[[int], Mapping[str, str]] | None = None) -> Executor:
    """Tasks in a spawn process pool when there are at least two per worker; inline otherwise. Task order."""

    def execute(tasks: Sequence[Any]) -> Iterator[Any]:
        if not tasks:
            return
        processes = min(workers, len(tasks))
        if processes <= 1 or len(tasks) < 2 * workers:
            with scoped_environ(worker_env(workers) if worker_env else {}):
                for task in tasks:
                    yield task.run()
            return
        env = dict(worker_env(max(1, workers // processes))) if worker_env else {}
        pool = multiprocessing.get_context("spawn").Pool(processes, initializer=_init_worker, initargs=(env,))
        try:
            yield from pool.imap(_run, tasks, chunksize=1)
            pool.close()
        finally:
            pool.terminate()
            pool.join()

    return execute
