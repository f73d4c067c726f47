"""Where independent tasks run: one `Task` protocol, a local pool (threads or processes) and Ray.

A stage plans its work as a list of picklable tasks whose `run()` returns its result; an
executor maps the list to results (yielded in task order). Stages make their output
independent of that order (results are keyed by index), so bytes never depend on the executor
or the worker count. This package knows no stage: tokenize, pack and export all use it alike.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from packtool.choices import ExecutorName
from packtool.errors import UsageError
from packtool.exec.local import cap_malloc_arenas, process_executor, scoped_environ, thread_executor
from packtool.exec.ray import ray_executor, require_ray
from packtool.exec.task import Executor, Task


def parse_executor(name: str | ExecutorName, ray_address: str | None = None) -> ExecutorName:
    """`--executor` as an ExecutorName; a UsageError (exit 2) for an unknown name or a stray `--ray-address`."""
    try:
        parsed = ExecutorName(str(name))
    except ValueError:
        raise UsageError(
            f"--executor {str(name)!r} is not one of {', '.join(e.value for e in ExecutorName)}, pick one"
        ) from None
    if parsed != ExecutorName.RAY and ray_address is not None:
        raise UsageError("--ray-address needs --executor ray, add it or drop --ray-address")
    if parsed == ExecutorName.RAY:
        require_ray()
    return parsed


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or `taskset` narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_count(
    requested: int | None, name: str | ExecutorName = ExecutorName.LOCAL, ray_address: str | None = None
) -> int:
    """How many workers a stage runs: `--workers` (all cores when left out), never more than the cores that run them.

    Work that runs on this machine (the local pool, a local Ray) gains nothing from more threads than cores:
    they only contend, and each costs a stack (and one thread of the Rust tokenizer's pool each). `--workers
    100000` once started 100,000 of them and ran for 20 minutes. A Ray cluster (`--ray-address`) has cores of
    its own, so there the request stands (the executor bounds the tasks in flight). Output bytes never depend
    on the count, so capping it changes nothing but the time.
    """
    cores = machine_cores()
    if requested is None:
        return cores
    if ray_address is not None and str(name) == ExecutorName.RAY.value:
        return max(1, requested)
    return max(1, min(requested, cores))


def make_executor(
    name: str | ExecutorName,
    workers: int,
    *,
    processes: bool = False,
    ray_address: str | None = None,
    worker_env: Callable[[int], Mapping[str, str]] | None = None,
    ahead: int | None = None,
) -> Executor:
    """The executor for `--executor NAME`: local threads (or processes) or Ray tasks (1 CPU each).

    `worker_env(threads)` gives environment variables each worker sets before its first task
    (e.g. a Rust library's thread count); `threads` is that worker's share of the cores (threads
    share one process: they get it once, with `threads = workers`). Results come in task order;
    `ahead` bounds how many tasks run past the oldest one not yet consumed (threads, Ray).
    """
    if parse_executor(name, ray_address) == ExecutorName.RAY:
        return ray_executor(workers, ray_address, dict(worker_env(1)) if worker_env else {}, ahead)
    if processes:
        return process_executor(workers, worker_env)
    return thread_executor(workers, ahead, worker_env)


__all__ = [
    "Executor",
    "Task",
    "cap_malloc_arenas",
    "machine_cores",
    "make_executor",
    "parse_executor",
    "scoped_environ",
    "worker_count",
]
