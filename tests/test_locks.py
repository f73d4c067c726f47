"""`exclusive_output`: one writer per output, the loser fails at once naming the holder, dead holders lose it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from packtool.errors import OutputLockedError
from packtool.formats.faults import fault_point
from packtool.formats.locks import exclusive_output, lock_path

HOLD = textwrap.dedent(
    """
    import sys, time
    from packtool.formats.locks import exclusive_output
    with exclusive_output(sys.argv[1]):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def _holder(out: Path, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "store"
    proc = _holder(out, 30)
    try:
        with pytest.raises(OutputLockedError) as info, exclusive_output(out):
            pass
        msg = str(info.value)
        assert f"pid {proc.pid}" in msg and "host" in msg and "\n" not in msg
    finally:
        proc.kill()
        proc.wait()


def test_lock_of_a_killed_holder_is_taken_over_and_released_clean(tmp_path: Path) -> None:
    out = tmp_path / "store"
    proc = _holder(out, 30)
    proc.kill()
    proc.wait()
    assert lock_path(out).exists()  # SIGKILL: the file stays, the kernel lock does not
    with exclusive_output(out) as lock:
        assert f'"pid": {os.getpid()}' in lock.read_text()
        with exclusive_output(out):  # re-entrant in one process
            pass
        assert lock.exists()
    assert not lock_path(out).exists()
    assert list(tmp_path.iterdir()) == []


def test_fault_point_is_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PACKTOOL_FAULT", raising=False)
    fault_point("x")
    monkeypatch.setenv("PACKTOOL_FAULT", "raise:y")
    fault_point("x")
    with pytest.raises(KeyboardInterrupt):
        fault_point("y")
    monkeypatch.setenv("PACKTOOL_FAULT", "oserror:y")
    with pytest.raises(OSError):
        fault_point("y")
    rec = tmp_path / "points"
    monkeypatch.setenv("PACKTOOL_FAULT", f"record:{rec}")
    fault_point("a")
    fault_point("b")
    assert rec.read_text().split() == ["a", "b"]
