"""Local executors: a thread pool (for GIL-free kernels) and a spawn process pool.

Threads suit work whose hot loop releases the GIL (numba `nogil` kernels, Rust tokenizers):
no pickling, one page-cache mapping, no process start-up. Processes suit work that holds the
GIL (JSON parsing in Python). With fewer than two tasks per worker, whole-task processes would
leave cores idle at the tail, so the process executor then runs tasks inline and lets the
task's own library threads use the cores.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from packtool.exec.task import Executor


def thread_executor(workers: int) -> Executor:
    """Tasks in a thread pool of `workers` threads (inline when one worker or one task)."""

    def execute(tasks: Sequence[Any]) -> Iterator[Any]:
        if workers <= 1 or len(tasks) <= 1:
            for task in tasks:
                yield task.run()
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="packtool") as pool:
            futures = [pool.submit(task.run) for task in tasks]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    return execute


def _run(task: Any) -> Any:
    return task.run()


def _init_worker(env: Mapping[str, str]) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool; a worker must not print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(env)


@contextlib.contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` for an inline run, restoring the previous values after."""
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
    """Tasks in a spawn process pool when there are at least two per worker; inline otherwise."""

    def execute(tasks: Sequence[Any]) -> Iterator[Any]:
        if not tasks:
            return
        processes = min(workers, len(tasks))
        if processes <= 1 or len(tasks) < 2 * workers:
            with _environ(worker_env(workers) if worker_env else {}):
                for task in tasks:
                    yield task.run()
            return
        env = dict(worker_env(max(1, workers // processes))) if worker_env else {}
        pool = multiprocessing.get_context("spawn").Pool(processes, initializer=_init_worker, initargs=(env,))
        try:
            yield from pool.imap_unordered(_run, tasks, chunksize=1)
            pool.close()
        finally:
            pool.terminate()
            pool.join()

    return execute
