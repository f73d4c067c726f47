"""Where tokenize chunks run: `local` (a process pool on this machine) or `ray` (a Ray cluster).

Both map the same `ChunkTask`s to `ChunkResult`s; the pipeline journals results as they come
and stitches chunks in index order, so the output bytes never depend on the executor.
With Ray every worker writes its chunk files into the run's work directory, which must
therefore be on a file system all nodes see (NFS, Lustre, a single machine). Ray is an
optional extra (`pip install 'packtool[ray]'`); without `--ray-address` a local Ray is
started with `num_cpus = workers` and shut down at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from packtool.config import StrEnum
from packtool.errors import ConfigError, PacktoolError
from packtool.tokenization.executor import ChunkTask, Executor, local_executor
from packtool.tokenization.journal import ChunkResult

__all__ = ["ExecutorName", "make_executor", "local_executor", "ray_executor"]


class ExecutorName(StrEnum):
    LOCAL = "local"
    RAY = "ray"


def make_executor(name: str, workers: int, ray_address: str | None = None) -> Executor:
    """The executor for `--executor` (`--ray-address` only makes sense with ray)."""
    name = ExecutorName(name)
    if name == ExecutorName.RAY:
        return ray_executor(workers, ray_address)
    if ray_address is not None:
        raise ConfigError("--ray-address needs --executor ray, add it or drop --ray-address")
    return local_executor(workers)


def _run_task(task: ChunkTask) -> ChunkResult:
    """The body of the Ray task: one core per task, so the tokenizer gets one thread."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return task.run()


def ray_executor(workers: int, address: str | None = None) -> Executor:
    """Run every chunk as a Ray task (1 CPU each); results are yielded as they finish."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--executor ray needs the ray package, pip install 'packtool[ray]' or use --executor local") from exc

    def execute(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        if not tasks:
            return
        started = not ray.is_initialized()
        if started:
            try:
                if address is None:
                    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"cannot start or join Ray ({exc}), --ray-address {address}, "
                                  "check the address (ray status) or leave it out for a local Ray") from exc
        remote = ray.remote(num_cpus=1, max_retries=1)(_run_task)
        pending: list[Any] = [remote.remote(task) for task in tasks]
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                try:
                    yield ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, PacktoolError):
                        raise cause from None
                    raise
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started:
                ray.shutdown()

    return execute
