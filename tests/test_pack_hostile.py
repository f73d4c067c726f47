"""Hostile inputs to pack, merge, stats, verify and the loader: one `error:` line, exit 1, nothing lost.

Table-driven through the real CLI: every case must exit 1 with exactly one `error:` line on stderr
(nothing on stdout, no traceback), leave nothing under the final name it would have written, and
leave every previous output byte-identical. Then the loader's checks on open, the files map
(verify), two writers of one pack directory, and a disk that fills up.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support import build_file, cli, make_store, zipf_lengths, zipf_texts

from packtool.errors import FormatError
from packtool.formats.pack_store import data_name, metadata_for, metadata_name, write_metadata_line

N = 64
PACKED = "packed/org--tiny-tok"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> Path:
    """A token store, a pack ROOT holding a committed (training, 64), a plain file, and shard stores."""
    w = tmp_path_factory.mktemp("hostile")
    make_store(w / "tok", zipf_lengths(300, seed=5), with_loss=True)
    code, _, err = cli("pack", str(w / "tok"), "--size", str(N), "--output", str(w / "out"), "-q")
    assert code == 0, err
    (w / "afile").write_text("not a directory")
    src = w / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in zipf_texts(40, seed=9)))
    for i in range(2):
        code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(w / f"shard{i}"),
                           "--num-shards", "2", "--shard-index", str(i), "--workers", "1", "-q")
        assert code == 0, err
    return w


def _copy(world: Path, tmp: Path, *names: str) -> None:
    for name in names:
        src = world / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, tmp / name)


def _edit_manifest(store: Path, **changes: object) -> None:
    m = json.loads((store / "manifest.json").read_text())
    m.update(changes)
    (store / "manifest.json").write_text(json.dumps(m))


def _edit_line(out: Path, change: Callable[[dict], None]) -> None:
    d = out / PACKED
    meta = metadata_for(d, "training", N)
    change(meta)
    write_metadata_line(d, meta)


def _flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x5A
    path.write_bytes(bytes(raw))


def _drop_entry(out: Path) -> None:
    d = out / PACKED
    meta = metadata_for(d, "training", N)
    victim = build_file(d, N, "seg_doc")
    del meta["files"][victim.name]
    write_metadata_line(d, meta)
    _flip(victim)


def _to_device(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _other_tokenizer(t: Path) -> None:
    shutil.copytree(t / "tok", t / "tok2")
    tok = json.loads((t / "tok2" / "manifest.json").read_text())["tokenizer"]
    _edit_manifest(t / "tok2", tokenizer={**tok, "sha256": "1" * 64})


# (id, files to copy into tmp, setup(tmp), CLI args (with {t} = tmp), expected message part, final name that must not appear)
CASES: list[tuple[str, tuple[str, ...], Callable[[Path], None] | None, str, str, str | None]] = [
    ("pack-output-is-a-file", ("tok", "afile"), None, "pack {t}/tok --size 64 --output {t}/afile", "cannot create the pack directory", None),
    ("pack-output-under-proc", ("tok",), None, "pack {t}/tok --size 64 --output /proc/packtool-x", "cannot create the pack directory", None),
    ("pack-seed-negative", ("tok", "out"), None, "pack {t}/tok --size 32 --output {t}/out --seed -1", "--seed must be an integer >= 0", "out/packed/org--tiny-tok/32_metadata.jsonl"),
    ("pack-size-huge", ("tok", "out"), None, "pack {t}/tok --size 99999999999999999999999 --output {t}/out", "supported maximum", None),
    ("pack-size-zero", ("tok", "out"), None, "pack {t}/tok --size 0 --output {t}/out", "positive integer", None),
    ("pack-missing-store", ("out",), None, "pack {t}/nope --size 32 --output {t}/out", "does not exist", "out/packed/org--tiny-tok/32_metadata.jsonl"),
    ("pack-a-pack-store", ("out",), None, "pack {t}/out --size 32 --output {t}/out2", "not a token store", "out2"),
    ("pack-manifest-version-string", ("tok", "out"), lambda t: _edit_manifest(t / "tok", format_version="1"),
     "pack {t}/tok --size 32 --output {t}/out", "format_version must be an integer", "out/packed/org--tiny-tok/32_metadata.jsonl"),
    ("pack-corrupted-store", ("tok", "out"), lambda t: _flip(t / "tok/tokens.bin"),
     "pack {t}/tok --size 32 --output {t}/out", "sha256", "out/packed/org--tiny-tok/32_metadata.jsonl"),
    # a failure after the pack directory was made: ROOT/packed/{tokenizer} was left behind, empty
    ("pack-overlong-error-into-a-new-root", ("tok",), None, "pack {t}/tok --size 8 --output {t}/new/root --overlong error",
     "--overlong", "new"),
    ("pack-mixture-of-tokenizers-into-a-new-root", ("tok",), _other_tokenizer,
     "pack {t}/tok {t}/tok2 --size 32 --output {t}/new", "different tokenizers", "new"),
    # a metadata file that never ends (a link to /dev/zero) was read until a MemoryError traceback
    ("verify-metadata-is-a-device", ("out",), lambda t: _to_device(t / "out" / PACKED / metadata_name(N)),
     "verify {t}/out", "pack metadata is not read (it is not a regular file", None),
    ("stats-metadata-is-a-device", ("out",), lambda t: _to_device(t / "out" / PACKED / metadata_name(N)),
     "stats {t}/out", "pack metadata is not read (it is not a regular file", None),
    ("stats-size-zero", ("tok",), None, "stats {t}/tok --size 0", "positive integer", None),
    ("stats-seed-negative", ("tok",), None, "stats {t}/tok --seed -1", "--seed must be an integer >= 0", None),
    ("stats-size-huge", ("tok",), None, "stats {t}/tok --size 99999999999999999999999", "supported maximum", None),
    ("stats-plot-not-png", ("tok",), None, "stats {t}/tok --plot {t}/x.txt", "PNG", "x.txt"),
    ("stats-a-plain-file", ("afile",), None, "stats {t}/afile", "neither a token store nor a pack file", None),
    ("stats-metadata-version-string", ("out",), lambda t: _edit_line(t / "out", lambda m: m.update(format_version="1")),
     "stats {t}/out", "format_version must be an integer", None),
    ("verify-files-map-missing", ("out",), lambda t: _edit_line(t / "out", lambda m: m.pop("files")),
     "verify {t}/out", "files map is missing", None),
    ("verify-files-map-entry-missing-and-byte-flipped", ("out",), lambda t: _drop_entry(t / "out"),
     "verify {t}/out", "files map lacks", None),
    ("verify-pad-id-outside-vocab", ("out",), lambda t: _edit_line(t / "out", lambda m: m.update(pad_id=99999)),
     "verify {t}/out", "pad_id 99999 is not a token id", None),
    ("verify-wrong-n-packs", ("out",), lambda t: _edit_line(t / "out", lambda m: m.update(n_packs=m["n_packs"] + 1)),
     "verify {t}/out", "metadata n_packs", None),
    ("verify-metadata-not-json", ("out",), lambda t: (t / "out" / PACKED / metadata_name(N)).write_text("{oops\n"),
     "verify {t}/out", "invalid JSON", None),
    ("verify-files-of-another-build", ("out",), lambda t: _edit_line(t / "out", lambda m: m.update(build="0" * 16)),
     "verify {t}/out", "files map lacks training_64.0000000000000000.npy", None),
    ("merge-output-is-a-file", ("shard0", "shard1", "afile"), None, "merge {t}/shard0 {t}/shard1 --output {t}/afile", "not a directory", None),
    ("merge-one-shard-missing", ("shard0",), None, "merge {t}/shard0 --output {t}/merged", "missing", "merged"),
    ("merge-not-a-shard", ("tok",), None, "merge {t}/tok --output {t}/merged", "not a shard", "merged"),
]


#: flag values outside their domain: usage errors, exit 2 (the rest are data, format or environment problems: 1)
USAGE = {"pack-seed-negative", "pack-size-huge", "pack-size-zero", "stats-size-zero", "stats-seed-negative",
         "stats-size-huge", "stats-plot-not-png"}


@pytest.mark.parametrize(("case", "copies", "setup", "args", "message", "absent"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_loses_nothing(
    world: Path, tmp_path: Path, case: str, copies: tuple[str, ...], setup: Callable[[Path], None] | None, args: str,
    message: str, absent: str | None,
) -> None:
    _copy(world, tmp_path, *copies)
    if setup is not None:
        setup(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = cli(*args.format(t=tmp_path).split(), "-q" if args.startswith(("pack", "verify", "merge")) else "--json")
    lines = err.strip().splitlines()
    assert code == (2 if case in USAGE else 1), (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0] and "Traceback" not in err
    assert out == ""  # nothing printed before the failure (stats --plot is checked first)
    assert snapshot(tmp_path) == before  # previous outputs untouched, nothing new (no temp, no lock file)
    if absent is not None:
        assert not (tmp_path / absent).exists()


# ---------------------------------------------------------------- loader: refuses what verify refuses


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.update(pad_id=99999), "pad_id 99999 is not a token id"),
        (lambda m: m.update(pad_id=700), "expected 0..599"),  # inside uint16, outside the 600-token vocabulary
        (lambda m: m.update(pad_id=-1), "pad_id -1"),
        (lambda m: m.update(n_packs=m["n_packs"] - 1), "metadata n_packs"),
        (lambda m: m.update(n_segments=m["n_segments"] + 3), "metadata n_segments"),
        (lambda m: m.update(build="f" * 16), "files map lacks training_64.ffffffffffffffff"),
        (lambda m: m.update(build="not-hex"), "is not 16 hex digits"),
    ],
)
def test_loader_refuses_lying_metadata(world: Path, tmp_path: Path, change: Callable[[dict], None], message: str) -> None:
    torch = pytest.importorskip("torch")
    assert torch is not None
    from packtool.loader import PackedDataset

    _copy(world, tmp_path, "out")
    PackedDataset(tmp_path / "out")  # sound before the edit
    _edit_line(tmp_path / "out", change)
    with pytest.raises(FormatError, match=message):
        PackedDataset(tmp_path / "out")


def test_loader_refuses_a_wrong_pack_size(world: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from packtool.loader import PackedDataset

    _copy(world, tmp_path, "out")
    d = tmp_path / "out" / PACKED
    meta = metadata_for(d, "training", N)
    meta["pack_size"] = 32  # a lie inside 64_metadata.jsonl
    (d / metadata_name(N)).write_text(json.dumps(meta) + "\n")
    with pytest.raises(FormatError, match="metadata pack_size is 32 but the files give 64"):
        PackedDataset(d)


def test_files_of_two_runs_are_never_read_together(world: Path, tmp_path: Path) -> None:
    """The issue's case: same sizes, another run's data file under the plain name. Readers use the build's files."""
    pytest.importorskip("torch")
    from packtool.loader import PackedDataset

    _copy(world, tmp_path, "tok", "out")
    d = tmp_path / "out" / PACKED
    ds = PackedDataset(d)
    first = ds[0]["input_ids"].clone()
    code, _, err = cli("pack", str(tmp_path / "tok"), "--size", str(N), "--output", str(tmp_path / "other"), "-q", "--seed", "9")
    assert code == 0, err
    alias = d / data_name("training", N)
    other = tmp_path / "other" / PACKED / data_name("training", N)
    assert alias.stat().st_size == other.stat().st_size and alias.read_bytes() != other.read_bytes()
    alias.unlink()
    shutil.copy2(other, alias)  # the plain name now holds another packing, sizes equal
    assert (PackedDataset(d)[0]["input_ids"] == first).all()  # the loader reads the committed build only
    code, _, err = cli("verify", str(d), "-q")
    assert code == 1 and "is not the data of the committed build" in err


# ---------------------------------------------------------------- two writers, full disk, old stores


HOLD = "import sys, time\nfrom packtool.formats.locks import exclusive_output\nwith exclusive_output(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n"


def test_second_pack_into_a_busy_directory_fails_at_once(world: Path, tmp_path: Path) -> None:
    _copy(world, tmp_path, "tok", "out")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out" / PACKED)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = snapshot(tmp_path / "out")
        code, _, err = cli("pack", str(tmp_path / "tok"), "--size", "32", "--output", str(tmp_path / "out"), "-q",
                           "--split", "validation")
    finally:
        holder.kill()
        holder.wait()
    assert code == 1 and err.count("\n") == 1 and f"pid {holder.pid}" in err and "another packtool run" in err
    assert snapshot(tmp_path / "out") == before
    code, _, err = cli("pack", str(tmp_path / "tok"), "--size", "32", "--output", str(tmp_path / "out"), "-q")
    assert code == 0, err  # the dead holder's lock is taken over


def test_two_splits_packed_at_once_keep_both_lines(world: Path, tmp_path: Path) -> None:
    """Concurrent runs on different splits: the loser fails fast and the metadata keeps every line it had."""
    _copy(world, tmp_path, "tok")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [
        subprocess.Popen([sys.executable, "-m", "packtool", "pack", str(tmp_path / "tok"), "--size", str(N), "--output",
                          str(tmp_path / "out"), "-q", "--split", split], env=env, stderr=subprocess.PIPE, text=True)
        for split in ("training", "validation")
    ]
    results = [(p.wait(), p.stderr.read() if p.stderr else "") for p in runs]
    for code, err in results:
        assert code == 0 or (code == 1 and "another packtool run" in err and err.count("\n") == 1), err
    done = {split for (code, _), split in zip(results, ("training", "validation"), strict=True) if code == 0}
    lines = {json.loads(x)["split"] for x in (tmp_path / "out" / PACKED / metadata_name(N)).read_text().splitlines()}
    assert lines == done and done


def test_full_disk_is_one_line_and_leaves_nothing(world: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Free space is checked before the matrices are mapped (the seam: `shutil.disk_usage`)."""
    _copy(world, tmp_path, "tok", "out")
    before = snapshot(tmp_path)
    import packtool.formats.pack_writer as pw

    monkeypatch.setattr(pw.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1 << 20))  # type: ignore[attr-defined]
    code, out, err = cli("pack", str(tmp_path / "tok"), "--size", str(N), "--output", str(tmp_path / "out"), "-q", "--seed", "3")
    assert code == 1 and err.count("\n") == 1 and "not enough free space" in err and "MiB free" in err
    assert snapshot(tmp_path) == before


def test_file_size_limit_is_one_line_not_sigbus(world: Path, tmp_path: Path) -> None:
    """A write that the file system refuses mid-run (EFBIG under `ulimit -f`, as ENOSPC would be) is one
    line and no leftovers: the matrices are preallocated, so the memory map never faults."""
    _copy(world, tmp_path, "tok", "out")
    before = snapshot(tmp_path)
    data_bytes = (world / "out" / PACKED / data_name("training", N)).stat().st_size
    limit = data_bytes // 2  # companions and metadata fit, the token matrix does not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the default kill

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    warm = [sys.executable, "-m", "packtool", "pack", str(tmp_path / "tok"), "--size", str(N), "-q", "--output"]
    subprocess.run([*warm, str(tmp_path / "warm")], env=env, check=True, timeout=120)  # numba's cache, unlimited
    shutil.rmtree(tmp_path / "warm")
    proc = subprocess.run([sys.executable, "-m", "packtool", "pack", str(tmp_path / "tok"), "--size", str(N), "--output",
                           str(tmp_path / "out"), "-q", "--seed", "3"], preexec_fn=limited, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot write") and "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before


def test_version_1_store_is_read_and_replaced_cleanly(world: Path, tmp_path: Path) -> None:
    """A store written before builds existed (plain names, format_version 1) still opens; re-packing it
    leaves only the new build (its plain companions removed, they are packtool's own names)."""
    _copy(world, tmp_path, "tok", "out")
    d = tmp_path / "out" / PACKED
    meta = metadata_for(d, "training", N)
    build = meta.pop("build")
    files = {}
    for name, rec in meta["files"].items():
        plain = name.replace(f".{build}", "")
        (d / name).replace(d / plain)
        files[plain] = rec
    meta.update(format_version=1, files=files)
    write_metadata_line(d, meta)
    code, _, err = cli("verify", str(d), "-q")
    assert code == 0, err
    code, _, err = cli("pack", str(tmp_path / "tok"), "--size", str(N), "--output", str(tmp_path / "out"), "-q")
    assert code == 0, err
    assert sorted(p.name for p in d.iterdir()) == sorted(snapshot(world / "out" / PACKED))
    assert np.array_equal(np.load(d / data_name("training", N)), np.load(world / "out" / PACKED / data_name("training", N)))


def test_second_merge_into_a_busy_output_fails_at_once(world: Path, tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "merged")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, _, err = cli("merge", str(world / "shard0"), str(world / "shard1"), "--output", str(tmp_path / "merged"), "-q")
    finally:
        holder.kill()
        holder.wait()
    assert code == 1 and err.count("\n") == 1 and f"pid {holder.pid}" in err
    assert not (tmp_path / "merged").exists()
    code, _, err = cli("merge", str(world / "shard0"), str(world / "shard1"), "--output", str(tmp_path / "merged"), "-q")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no lock file, no staging left
