"""Where tokenize chunks and pack blocks run: `local` (this machine) or `ray` (a Ray cluster).

Both map the same `ChunkTask`s to `ChunkResult`s; the pipeline journals results as they come
and stitches chunks in index order, so the output bytes never depend on the executor.
With Ray every worker writes its chunk files into the run's work directory, which must
therefore be on a file system all nodes see (NFS, Lustre, a single machine). Ray is an
optional extra (`pip install 'packtool[ray]'`); without `--ray-address` a local Ray is
started with `num_cpus = workers` and shut down at the end. Pack blocks (`PackBlockTask`, one
fixed range of pack rows each) run in a thread pool locally, or as Ray tasks that write into the
pack file on the shared file system; every block is disjoint, so bytes never depend on either.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, TypeVar

from packtool.config import StrEnum
from packtool.errors import ConfigError, PacktoolError
from packtool.tokenization.executor import ChunkTask, Executor, local_executor
from packtool.tokenization.journal import ChunkResult

if TYPE_CHECKING:
    from packtool.packing.writer import PackBlockTask

__all__ = [
    "ExecutorName",
    "PackExecutor",
    "local_executor",
    "local_pack_executor",
    "make_executor",
    "make_pack_executor",
    "ray_executor",
    "ray_pack_executor",
]

T = TypeVar("T")
R = TypeVar("R")


class ExecutorName(StrEnum):
    LOCAL = "local"
    RAY = "ray"


def _parse_executor(name: str, ray_address: str | None) -> ExecutorName:
    """`--executor` as an ExecutorName; ConfigError for an unknown name or a stray `--ray-address`."""
    if name not in {e.value for e in ExecutorName}:
        raise ConfigError(f"--executor {name!r} is not one of {', '.join(e.value for e in ExecutorName)}, pick one")
    parsed = ExecutorName(name)
    if parsed != ExecutorName.RAY and ray_address is not None:
        raise ConfigError("--ray-address needs --executor ray, add it or drop --ray-address")
    return parsed


def make_executor(name: str, workers: int, ray_address: str | None = None) -> Executor:
    """The executor for `tokenize --executor` (`--ray-address` only makes sense with ray)."""
    if _parse_executor(name, ray_address) == ExecutorName.RAY:
        return ray_executor(workers, ray_address)
    return local_executor(workers)


def _run_task(task: ChunkTask) -> ChunkResult:
    """The body of the Ray task: one core per task, so the tokenizer gets one thread."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return task.run()


@contextlib.contextmanager
def _ray_session(workers: int, address: str | None) -> Iterator[Any]:
    """The ray module, initialised (a local Ray with num_cpus = workers, or the cluster at address)."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "--executor ray needs the ray package, pip install 'packtool[ray]' or use --executor local"
        ) from exc
    started = not ray.is_initialized()
    if started:
        try:
            if address is None:
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(
                f"cannot start or join Ray ({exc}), --ray-address {address}, "
                "check the address (ray status) or leave it out for a local Ray"
            ) from exc
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _ray_map(ray: Any, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
    """`fn` over `items` as Ray tasks (1 CPU each), yielded as they finish; PacktoolErrors re-raised as is."""
    remote = ray.remote(num_cpus=1, max_retries=1)(fn)
    pending: list[Any] = [remote.remote(item) for item in items]
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


def _require_ray() -> None:
    """Fail when the executor is made (before any work) if ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "--executor ray needs the ray package, pip install 'packtool[ray]' or use --executor local"
        ) from exc


def ray_executor(workers: int, address: str | None = None) -> Executor:
    """Run every chunk as a Ray task (1 CPU each); results are yielded as they finish."""
    _require_ray()

    def execute(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        if not tasks:
            return
        with _ray_session(workers, address) as ray:
            yield from _ray_map(ray, _run_task, tasks)

    return execute


# ---- pack blocks: `PackBlockTask`s (packtool.packing.writer) -> (p0, p1) row ranges written ----

PackExecutor = Callable[[Sequence["PackBlockTask"]], Iterator[tuple[int, int]]]


def make_pack_executor(name: str, workers: int, ray_address: str | None = None) -> PackExecutor:
    """The executor for `pack --executor` (local threads or Ray tasks)."""
    if _parse_executor(name, ray_address) == ExecutorName.RAY:
        return ray_pack_executor(workers, ray_address)
    return local_pack_executor(workers)


def _run_block(task: PackBlockTask) -> tuple[int, int]:
    return task.run()


def local_pack_executor(workers: int) -> PackExecutor:
    """Blocks in a thread pool: the copy kernel releases the GIL and threads share the memory maps.

    Threads beat a process pool here (scripts/bench_pack_write.py): no pickling of the segment
    slices, no process start-up or per-process store opening, one page cache mapping.
    """

    def execute(tasks: Sequence[PackBlockTask]) -> Iterator[tuple[int, int]]:
        if workers <= 1 or len(tasks) <= 1:
            for task in tasks:
                yield task.run()
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pack-block") as pool:
            futures = [pool.submit(task.run) for task in tasks]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    return execute


def ray_pack_executor(workers: int, address: str | None = None) -> PackExecutor:
    """Every block as a Ray task: the token store and the pack ROOT must be on a shared file system."""
    _require_ray()

    def execute(tasks: Sequence[PackBlockTask]) -> Iterator[tuple[int, int]]:
        if not tasks:
            return
        with _ray_session(workers, address) as ray:
            yield from _ray_map(ray, _run_block, tasks)

    return execute
