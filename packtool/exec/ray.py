"""The Ray executor: every task as a Ray task (1 CPU each), results yielded as they finish.

Results come back in task order (see `packtool.exec.task`). Ray is an optional extra (`pip install 'packtool[ray]'`). Without an address a local Ray is
started with `num_cpus = workers` and shut down at the end. Tasks write their outputs where
every node can see them (a shared file system); a `PacktoolError` raised inside a task is
re-raised as itself, so the CLI still prints one line.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from packtool.errors import ConfigError, PacktoolError
from packtool.exec.task import Executor

_MISSING = "--executor ray needs the ray package, pip install 'packtool[ray]' or use --executor local"


def require_ray() -> None:
    """Fail before any work when ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError(_MISSING) from exc


@contextlib.contextmanager
def _ray_session(workers: int, address: str | None) -> Iterator[Any]:
    """The ray module, initialised (a local Ray with num_cpus = workers, or the cluster at address)."""
    require_ray()
    import ray

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


def _run_with_env(task: Any, env: Mapping[str, str]) -> Any:
    """The body of a Ray task: set the worker's environment, then run."""
    os.environ.update(env)
    return task.run()


def ray_executor(
    workers: int, address: str | None = None, env: Mapping[str, str] | None = None, ahead: int | None = None
) -> Executor:
    """Run every task as a Ray task with `env` set in its worker process; results in task order.

    With `ahead`, at most that many tasks past the oldest one not yet yielded are submitted.
    """
    require_ray()
    task_env = dict(env or {})

    def execute(tasks: Sequence[Any]) -> Iterator[Any]:
        if not tasks:
            return
        with _ray_session(workers, address) as ray:
            remote = ray.remote(num_cpus=1, max_retries=1)(_run_with_env)
            limit = max(workers, ahead) if ahead else len(tasks)
            todo = iter(tasks)
            pending: deque[Any] = deque(remote.remote(task, task_env) for task in islice(todo, limit))
            try:
                while pending:
                    ref = pending.popleft()
                    pending.extend(remote.remote(task, task_env) for task in islice(todo, 1))
                    try:
                        yield ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, PacktoolError):
                            raise cause from None
                        raise
            finally:
                for ref in pending:
                    ray.cancel(ref, force=True)

    return execute
