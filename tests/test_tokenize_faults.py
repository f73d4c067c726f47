"""Fault injection into `packtool tokenize --overwrite` at EVERY writer point (packtool.formats.faults).

A run that replaces an old store with a new one is interrupted at each point the writers declare
(found by running once with `PACKTOOL_FAULT=record:FILE`, so a new point is tested automatically)
by an exception (Ctrl-C), an I/O error, SIGTERM, and SIGKILL. After each: the final name holds the
old store or the new one byte for byte, never a mix (after SIGKILL between the two renames the
next run's recovery restores one of them); the rerun ends with bytes identical to an
uninterrupted run and leaves nothing beside the output (no lock, staging, old copy or work dir).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli, zipf_texts

from packtool.formats.faults import ENV
from packtool.formats.token_store import recover_token_store

ROOT = Path(__file__).resolve().parents[1]
#: every point the tokenize write path declares: a new one fails the first test until it is listed (and so tested)
EXPECTED = {
    "tokenize.chunk:commit",
    "tokenize.journal:record",
    "tokenize.journal:recorded",
    "tokens.store:fsync",
    "tokens.store:manifest",
    "tokens.store:manifest-written",
    "atomic.swap:exchanged",  # one atomic exchange of the old and new store (renameat2)
    "atomic.swap:remove-old",
}
#: the two-rename swap, used where the file system cannot exchange (tested in-process below)
FALLBACK = ("atomic.swap:rename-old", "atomic.swap:rename-new")


def lines(rows: list[object]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _args(root: Path, out: Path) -> list[str]:
    return ["tokenize", str(root / "new.jsonl"), "--tokenizer", str(root / "tok"), "--output", str(out), "-q",
            "--workers", "1", "--chunk-bytes", "3000", "--overwrite"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> dict[str, object]:
    """Old store, reference new store (uninterrupted), and every point the write path reaches."""
    root = tmp_path_factory.mktemp("faults")
    shutil.copytree(bpe_tokenizer_dir, root / "tok")
    (root / "old.jsonl").write_bytes(lines([{"text": t} for t in zipf_texts(50, seed=1)]))
    (root / "new.jsonl").write_bytes(lines([{"text": t} for t in zipf_texts(120, seed=2)]))
    old = root / "old"
    assert cli("tokenize", str(root / "old.jsonl"), "--tokenizer", str(root / "tok"), "--output", str(old), "-q")[0] == 0
    ref_dir = root / "ref"
    ref_dir.mkdir()
    assert cli(*_args(root, ref_dir / "out"))[0] == 0
    record = root / "points.txt"
    case = root / "record"
    case.mkdir()
    shutil.copytree(old, case / "out")
    os.environ[ENV] = f"record:{record}"
    try:
        assert cli(*_args(root, case / "out"))[0] == 0
    finally:
        del os.environ[ENV]
    points = sorted(set(record.read_text().split()))
    return {"root": root, "old": store_bytes(old), "new": store_bytes(ref_dir / "out"), "points": points}


def test_the_write_path_declares_every_expected_point(world: dict[str, object]) -> None:
    assert set(world["points"]) == EXPECTED, sorted(set(world["points"]) ^ EXPECTED)  # type: ignore[arg-type]


def _points() -> list[str]:
    return sorted(EXPECTED)


@pytest.mark.parametrize("mode", ["raise", "oserror"])
@pytest.mark.parametrize("point", FALLBACK)
def test_two_rename_fallback_keeps_old_or_new(
    world: dict[str, object], tmp_path: Path, point: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where `exchange` is unsupported: an exception at either rename puts the old store back (no old or
    staging copy left; the resume state stays for the rerun), and the rerun ends clean."""
    import packtool.formats.atomic as atomic

    root = Path(str(world["root"]))
    out = tmp_path / "case" / "out"
    shutil.copytree(root / "old", out)
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    monkeypatch.setenv(ENV, f"{mode}:{point}")
    from packtool.formats import faults

    faults.reset()
    code, _, _ = cli(*_args(root, out))
    monkeypatch.delenv(ENV)
    assert code != 0
    assert store_bytes(out) == world["old"]
    assert not [p.name for p in out.parent.iterdir() if ".old-" in p.name or ".tmp-" in p.name]
    assert cli(*_args(root, out))[0] == 0 and store_bytes(out) == world["new"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # the resume state went with the rerun


@pytest.mark.parametrize("mode", ["raise", "oserror", pytest.param("term", marks=pytest.mark.slow), "kill"])
@pytest.mark.parametrize("point", _points())
def test_interrupt_at_every_point_keeps_old_or_new_and_rerun_is_identical(
    world: dict[str, object], tmp_path: Path, point: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(str(world["root"]))
    case = tmp_path / "case"
    case.mkdir()
    out = case / "out"
    old_src = root / "old"
    shutil.copytree(old_src, out)
    fault = f"{mode}:{point}"
    if mode in ("raise", "oserror"):  # in-process: an exception unwinds every writer
        monkeypatch.setenv(ENV, fault)
        code, _, err = cli(*_args(root, out))
        monkeypatch.delenv(ENV)
        assert code != 0 or point == "atomic.swap:remove-old" and mode == "raise", (code, err)
        if mode == "oserror":
            assert code == 1 and err.startswith("error: ") and err.count("\n") == 1, err
    else:  # a real signal to a real process
        env = {**os.environ, ENV: fault, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, "-m", "packtool", *_args(root, out)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        if mode == "term":
            assert proc.returncode == 143 and proc.stderr.count("\n") == 1, proc.stderr
        else:
            assert proc.returncode == -9
    if not out.exists():  # only SIGKILL between the two renames; the next run repairs it first
        assert mode == "kill" and point == "atomic.swap:rename-new", sorted(p.name for p in case.iterdir())
        assert recover_token_store(out) is not None
    assert store_bytes(out) in (world["old"], world["new"]), "the final name holds a mix"
    assert cli(*_args(root, out))[0] == 0
    assert store_bytes(out) == world["new"]
    assert sorted(p.name for p in case.iterdir()) == ["out"]
