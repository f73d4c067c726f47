"""Fault injection at EVERY named point of the pack and merge writers (`packtool.formats.faults`).

The points are not listed here: each scenario runs once with `PACKTOOL_FAULT=record:FILE` and the
test then interrupts a fresh copy of the previous output at each recorded point, so a writer step
added later is covered without touching this file. For every point and every way to die (Ctrl-C,
SIGTERM, SIGKILL):
- right after the interrupted run, what readers see is the old output or the new one, byte for
  byte, never a mix (and after Ctrl-C / SIGTERM nothing else is left at all);
- a rerun exits 0 and leaves exactly the bytes of an uninterrupted run: nothing left over.
Killed runs are forked children of the test process (no interpreter start-up per point).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import cli, make_store, zipf_lengths

from packtool.formats import faults
from packtool.formats.pack_store import data_name, metadata_for, open_pack_split

N = 64
PACKED = "packed/org--tiny-tok"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones included), by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() or p.is_symlink()}


def run_faulted(spec: str, args: list[str]) -> int:
    """Run the CLI with `PACKTOOL_FAULT=spec` in a forked child; its exit code, or -signal if killed."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 99
        try:
            os.environ[faults.ENV] = spec
            faults.reset()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                code, _, _ = cli(*args)
            if code not in (130, 143) or err.getvalue().count("\n") > 1:
                code = 98  # not the one-line failure we expect
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


EXPECT = {"raise": (130,), "term": (143,), "kill": (-signal.SIGKILL,)}  # 130: Ctrl-C, as typer exits


@dataclass
class Scene:
    """One writer scenario: the output before, the output of an uninterrupted run, the points on the way."""

    before: Path  # a directory holding the previous output (copied for every case)
    args: Callable[[Path], list[str]]  # CLI arguments writing the new output under a copy of `before`
    new: dict[str, bytes]  # snapshot of an uninterrupted run
    points: list[str]
    readers_view: Callable[[Path], dict[str, bytes]]  # what a reader sees; must be old or new, never a mix
    #: points where a SIGKILL may leave the plain alias one build behind a committed metadata line
    alias_window: tuple[str, ...] = ()
    #: a SIGKILL may leave some final names missing (never mixed) until the next run puts them back
    may_miss: bool = False


def make_scene(
    base: Path,
    before: Path,
    args: Callable[[Path], list[str]],
    view: Callable[[Path], dict[str, bytes]],
    alias_window: tuple[str, ...] = (),
    may_miss: bool = False,
) -> Scene:
    ref = Path(shutil.copytree(before, base / "reference"))
    code, _, err = cli(*args(ref))
    assert code == 0, err
    rec = Path(shutil.copytree(before, base / "recorded"))
    points_file = base / "points.txt"
    os.environ[faults.ENV] = f"record:{points_file}"
    try:
        code, _, err = cli(*args(rec))
    finally:
        del os.environ[faults.ENV]
    assert code == 0, err
    points = list(dict.fromkeys(points_file.read_text().split()))
    assert snapshot(rec) == snapshot(ref)  # recording changes nothing
    return Scene(before, args, snapshot(ref), points, view, alias_window, may_miss)


def check_every_point(scene: Scene, base: Path, mode: str) -> int:
    old = snapshot(scene.before)
    old_view, new_view = scene.readers_view(scene.before), scene.readers_view(base / "reference")
    assert old_view != new_view  # the scenario really changes the output
    for i, point in enumerate(scene.points):
        work = Path(shutil.copytree(scene.before, base / f"{mode}-{i}"))
        code = run_faulted(f"{mode}:{point}", scene.args(work))
        assert code in EXPECT[mode], (point, code)
        view = scene.readers_view(work)
        if mode == "kill" and point.startswith(scene.alias_window) and view.get("alias-is-committed") == b"0":
            # the metadata is committed, the alias not yet re-linked: packtool's readers use the build's
            # files (all new), and verify names the stale alias; the rerun below re-links it
            assert {**view, "alias-is-committed": b"1"} == new_view
            code, _, err = cli("verify", str(work / "out"), "-q")
            assert code == 1 and "is not the data of the committed build" in err and err.count("\n") == 1
        elif mode == "kill" and scene.may_miss and view not in (old_view, new_view):
            assert set(view) < set(old_view) | set(new_view), f"unknown files after {mode} at {point}"
            sides = {side for name, data in view.items() for side, ref in (("old", old_view), ("new", new_view))
                     if ref.get(name) == data and old_view.get(name) != new_view.get(name)}
            assert len(sides) <= 1 and all(data in (old_view.get(n), new_view.get(n)) for n, data in view.items()), (
                f"mixed output after {mode} at {point}"
            )
        else:
            assert view in (old_view, new_view), f"mixed output after {mode} at {point}"
        if mode != "kill":  # interrupted cleanly: nothing but the old or the new output
            assert snapshot(work) in (old, scene.new), f"leftovers after {mode} at {point}"
        code, _, err = cli(*scene.args(work))
        assert code == 0, (point, err)
        assert snapshot(work) == scene.new, f"rerun after {mode} at {point} differs from an uninterrupted run"
        shutil.rmtree(work)
    return len(scene.points)


# ---------------------------------------------------------------- pack


def pack_view(root: Path) -> dict[str, bytes]:
    """The training split as readers get it (metadata line + the files it names, opened and checked),
    the plain alias, and the untouched validation split."""
    d = root / PACKED
    ps = open_pack_split(d, "training", N)
    meta = metadata_for(d, "training", N)
    view = {name: (d / name).read_bytes() for name in meta["files"]}
    view["line"] = json.dumps(meta, sort_keys=True).encode()
    data = data_name("training", N, meta["build"])
    assert np.asarray(ps.tokens).tobytes() == np.load(d / data, mmap_mode="r").tobytes()
    alias = d / data_name("training", N)
    if alias.exists():  # the convenience alias holds the data of the old or of the new build, whole
        view["alias-is-committed"] = b"1" if alias.read_bytes() == view[data] else b"0"
    other = metadata_for(d, "validation", N)
    view["validation"] = json.dumps(other, sort_keys=True).encode() + b"".join(
        (d / name).read_bytes() for name in other["files"]
    )
    return view


@pytest.fixture(scope="module")
def pack_scene(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scene, Path]:
    base = tmp_path_factory.mktemp("pack-faults")
    store = make_store(base / "tok", zipf_lengths(300, seed=3), with_loss=True)
    before = base / "before"
    for split in ("training", "validation"):
        code, _, err = cli("pack", str(store), "--size", str(N), "--output", str(before / "out"), "-q", "--split", split)
        assert code == 0, err

    def args(work: Path) -> list[str]:
        return ["pack", str(store), "--size", str(N), "--output", str(work / "out"), "-q", "--seed", "1", "--workers", "2"]

    window = ("pack.metadata.after", "pack.alias.before")
    return make_scene(base, before, args, lambda root: pack_view(root / "out"), window), base


@pytest.mark.parametrize("mode", ["raise", "term", "kill"])
def test_pack_every_fault_point(pack_scene: tuple[Scene, Path], mode: str) -> None:
    scene, base = pack_scene
    kinds = {p.split(":")[0] for p in scene.points}
    assert {"pack.write.before", "pack.rename.before", "pack.metadata.before", "pack.remove.before"} <= kinds
    assert check_every_point(scene, base, mode) >= 20


@pytest.fixture(scope="module")
def validation_scene(tmp_path_factory: pytest.TempPathFactory) -> tuple[Scene, Path]:
    """`pack --validation` writes two splits; both metadata lines are committed by one rewrite."""
    base = tmp_path_factory.mktemp("validation-faults")
    store = make_store(base / "tok", zipf_lengths(300, seed=5), with_loss=True)
    before = base / "before"
    code, _, err = cli("pack", str(store), "--size", str(N), "--output", str(before / "out"), "-q", "--validation", "0.3")
    assert code == 0, err

    def args(work: Path) -> list[str]:
        return ["pack", str(store), "--size", str(N), "--output", str(work / "out"), "-q", "--validation", "0.5",
                "--seed", "1"]

    window = ("pack.metadata.after", "pack.alias.before")
    return make_scene(base, before, args, lambda root: pack_view(root / "out"), window), base


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_pack_validation_never_mixes_an_old_and_a_new_split(validation_scene: tuple[Scene, Path], mode: str) -> None:
    """Interrupted anywhere, readers see the old training AND validation splits or both new ones: never a new
    training split beside a validation split drawn by another run (its documents could be in training)."""
    scene, base = validation_scene
    assert sum(p.startswith("pack.rename.before:validation") for p in scene.points) >= 5
    assert check_every_point(scene, base, mode) >= 20


def test_pack_rerun_cleans_what_a_killed_run_left(pack_scene: tuple[Scene, Path]) -> None:
    """Temps of a dead pid and files of an uncommitted build go; a live pid's temp and foreign files stay."""
    scene, base = pack_scene
    work = Path(shutil.copytree(scene.before, base / "leftovers"))
    d = work / "out" / PACKED
    rename = next(p for p in scene.points if p.startswith("pack.rename.before:") and p.endswith(".seg_src.npy"))
    assert run_faulted(f"kill:{rename}", scene.args(work)) == -signal.SIGKILL
    names = {p.name for p in d.iterdir()}
    assert any(n.startswith(".") and ".tmp-" in n for n in names)  # the dead run's temps
    sleeper = subprocess.Popen(["sleep", "60"])  # a live process that is not this one
    live = d / f".training_{N}.npy.tmp-{sleeper.pid}"
    live.write_bytes(b"a live run's temp")
    (d / "notes.txt").write_text("mine")
    try:
        code, _, err = cli(*scene.args(work))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 0, err
    after = {p.name for p in d.iterdir()}
    assert after - {p.rsplit("/", 1)[-1] for p in scene.new} == {live.name, "notes.txt"}
    live.unlink()
    (d / "notes.txt").unlink()
    assert snapshot(work) == scene.new


# ---------------------------------------------------------------- merge


def shard_stores(base: Path, tokenizer: Path, texts: list[str], tag: str) -> list[Path]:
    src = base / f"{tag}.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = []
    for i in range(2):
        shard = base / f"{tag}-shard{i}"
        code, _, err = cli("tokenize", str(src), "--tokenizer", str(tokenizer), "--output", str(shard), "--workers", "1",
                           "--num-shards", "2", "--shard-index", str(i), "--chunk-bytes", "2048", "-q")
        assert code == 0, err
        out.append(shard)
    return out


def store_view(root: Path) -> dict[str, bytes]:
    from packtool.formats.token_store import open_token_store

    store = open_token_store(root / "merged", check_hashes=True)
    return {p.name: p.read_bytes() for p in sorted(store.path.iterdir())}


@pytest.fixture(scope="module")
def merge_scene(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> tuple[Scene, Path]:
    from support import zipf_texts

    base = tmp_path_factory.mktemp("merge-faults")
    old_shards = shard_stores(base, bpe_tokenizer_dir, zipf_texts(120, seed=1), "a")
    new_shards = shard_stores(base, bpe_tokenizer_dir, zipf_texts(140, seed=2), "b")
    before = base / "before"
    code, _, err = cli("merge", *map(str, old_shards), "--output", str(before / "merged"), "-q")
    assert code == 0, err

    def args(work: Path) -> list[str]:
        return ["merge", *map(str, new_shards), "--output", str(work / "merged"), "--overwrite", "-q"]

    return make_scene(base, before, args, store_view), base


@pytest.mark.parametrize("mode", ["raise", "term", "kill"])
def test_merge_every_fault_point(merge_scene: tuple[Scene, Path], mode: str) -> None:
    scene, base = merge_scene
    assert any(p.startswith("atomic.") for p in scene.points)
    assert check_every_point(scene, base, mode) >= 3



# ---------------------------------------------------------------- export


def export_view(root: Path) -> dict[str, bytes]:
    """What a trainer reads: every file under the export directory's final names."""
    out = root / "exported"
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith(".")}


@pytest.fixture(scope="module", params=["megatron-bridge", "nemo"])
def export_scene(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Scene, Path]:
    target = request.param
    base = tmp_path_factory.mktemp(f"export-faults-{target}")
    store = make_store(base / "tok", zipf_lengths(200, seed=4), with_loss=True)
    for seed in ("0", "1"):
        code, _, err = cli("pack", str(store), "--size", str(N), "--output", str(base / f"packs{seed}"), "-q", "--seed", seed)
        assert code == 0, err
    before = base / "before"
    code, _, err = cli("export", str(base / "packs0"), "--to", target, "--output", str(before / "exported"))
    assert code == 0, err

    def args(work: Path) -> list[str]:
        return ["export", str(base / "packs1"), "--to", target, "--output", str(work / "exported"), "--overwrite"]

    return make_scene(base, before, args, export_view, may_miss=True), base


@pytest.mark.parametrize("mode", ["raise", "term", "kill"])
def test_export_every_fault_point(export_scene: tuple[Scene, Path], mode: str) -> None:
    scene, base = export_scene
    assert {p.split(":")[0] for p in scene.points} >= {"export.aside.before", "export.rename.before", "export.committed"}
    assert check_every_point(scene, base, mode) >= 4
