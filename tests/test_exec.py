"""Local executors: results in task order, and `ahead` bounds how far the work runs past the consumer."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from packtool.exec import make_executor

_LOCK = threading.Lock()


@dataclass(frozen=True)
class Sleepy:
    index: int
    seconds: float
    started: list[int]

    def run(self) -> int:
        with _LOCK:
            self.started.append(self.index)
        time.sleep(self.seconds)
        return self.index


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_results_come_in_task_order_whatever_finishes_first(workers: int) -> None:
    started: list[int] = []
    tasks = [Sleepy(i, 0.03 if i % 3 == 0 else 0.0, started) for i in range(12)]
    assert list(make_executor("local", workers)(tasks)) == list(range(12))
    assert sorted(started) == list(range(12))


def test_ahead_bounds_the_tasks_started_past_the_oldest_unconsumed() -> None:
    started: list[int] = []
    tasks = [Sleepy(i, 0.2 if i == 0 else 0.0, started) for i in range(20)]
    run = make_executor("local", 2, ahead=3)(tasks)
    assert next(run) == 0  # task 0 is slow: the others must not all have run meanwhile
    with _LOCK:
        assert len(started) <= 4, started
    assert list(run) == list(range(1, 20))


def test_env_is_set_while_tasks_run_and_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("PACKTOOL_TEST_ENV", raising=False)

    @dataclass(frozen=True)
    class ReadEnv:
        def run(self) -> str | None:
            return os.environ.get("PACKTOOL_TEST_ENV")

    run = make_executor("local", 2, worker_env=lambda n: {"PACKTOOL_TEST_ENV": str(n)})
    assert list(run([ReadEnv(), ReadEnv(), ReadEnv()])) == ["2", "2", "2"]
    assert "PACKTOOL_TEST_ENV" not in os.environ
