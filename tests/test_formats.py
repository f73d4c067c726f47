"""Golden files pin the on-disk token-store format; damaged stores raise FormatError naming the file.

The golden stores in tests/golden/ were written once by TokenStoreWriter and are versioned:
if a change to packtool/formats/ alters a single byte, these tests fail, and the change
needs a format_version bump and a CHANGELOG entry (docs/FORMAT.md, "Versioning").
Regenerate deliberately with PACKTOOL_REGEN_GOLDEN=1 pytest tests/test_formats.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from packtool.errors import FormatError
from packtool.formats import pack_store as ps
from packtool.formats.atomic import atomic_directory
from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id, open_token_store

GOLDEN = Path(__file__).parent / "golden"

# Four documents, one empty, ids at the uint16 edges; loss masks the "prompt" of doc 0.
U16_IDS = np.array([0, 1, 65535, 7, 8, 9, 300, 301, 302, 65534], np.int64)
U16_LENGTHS = np.array([3, 0, 2, 5], np.int64)
U16_LOSS = np.array([0, 1, 1, 1, 1, 1, 1, 1, 1, 1], np.uint8)
# Ids above 65535 force uint32; every token is a target, so no tokens.loss is written.
U32_IDS = np.array([65536, 70000, 5, 2**32 - 1, 0], np.int64)
U32_LENGTHS = np.array([2, 3], np.int64)
MANIFEST_EXTRA = {
    "packtool_version": "0.1.0",
    "tokenizer": {"name": "golden-tok", "sha256": "0" * 64, "vocab_size": 65536, "bos_id": None, "eos_id": 0, "pad_id": 1},
    "bos": False,
    "eos": True,
    "input_format": "text",
    "sources": [{"path": "golden.jsonl", "sha256": "1" * 64, "records": 4, "documents": 4, "rejected": 0}],
}
CASES = {
    "token_store_u16": (U16_IDS, U16_LENGTHS, U16_LOSS, 65535),
    "token_store_u32": (U32_IDS, U32_LENGTHS, None, 2**32 - 1),
}


def write_case(directory: Path, name: str) -> dict:
    ids, lengths, loss, max_id = CASES[name]
    directory.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(directory, dtype_for_max_id(max_id))
    k = lengths.size // 2  # two appends: streaming in batches must not change a byte
    cut = int(lengths[:k].sum())
    writer.append(ids[:cut], lengths[:k], None if loss is None else loss[:cut])
    writer.append(ids[cut:], lengths[k:], None if loss is None else loss[cut:])
    extra = dict(MANIFEST_EXTRA)
    extra["tokenizer"] = {**extra["tokenizer"], "vocab_size": max_id + 1}  # consistent with the dtype rule
    return writer.finish(extra)


if os.environ.get("PACKTOOL_REGEN_GOLDEN") == "1":  # pragma: no cover - deliberate regeneration only
    for _name in CASES:
        shutil.rmtree(GOLDEN / _name, ignore_errors=True)
        write_case(GOLDEN / _name, _name)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A writable copy of the uint16 golden store, to damage."""
    return Path(shutil.copytree(GOLDEN / "token_store_u16", tmp_path / "store"))


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text("utf-8"))


def _rewrite_manifest(path: Path, **changes: object) -> None:
    manifest = _manifest(path)
    manifest.update(changes)
    (path / "manifest.json").write_text(json.dumps(manifest))


# ---------------------------------------------------------------- golden bytes


@pytest.mark.parametrize("name", sorted(CASES))
def test_writer_reproduces_golden_bytes(tmp_path: Path, name: str) -> None:
    write_case(tmp_path / name, name)
    golden_files = sorted(p.name for p in (GOLDEN / name).iterdir())
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == golden_files
    for fname in golden_files:
        assert (tmp_path / name / fname).read_bytes() == (GOLDEN / name / fname).read_bytes(), fname


def test_golden_u16_bytes_are_the_documented_layout() -> None:
    """Headerless little-endian arrays, exactly as docs/FORMAT.md says (no writer involved)."""
    g = GOLDEN / "token_store_u16"
    assert (g / "tokens.bin").read_bytes() == U16_IDS.astype("<u2").tobytes()
    assert (g / "tokens.bin").read_bytes()[4:6] == b"\xff\xff"
    assert (g / "tokens.boundaries").read_bytes() == np.array([3, 3, 5, 10], "<i8").tobytes()
    assert (g / "tokens.loss").read_bytes() == bytes([0, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    assert np.array_equal(np.memmap(g / "tokens.bin", dtype="<u2", mode="r"), U16_IDS)


def test_golden_u32_has_no_loss_file_and_uint32_tokens() -> None:
    g = GOLDEN / "token_store_u32"
    assert not (g / "tokens.loss").exists()
    assert (g / "tokens.bin").read_bytes() == U32_IDS.astype("<u4").tobytes()
    assert (g / "tokens.boundaries").read_bytes() == np.array([2, 5], "<i8").tobytes()
    manifest = _manifest(g)
    assert manifest["dtype"] == "uint32"
    assert set(manifest["files"]) == {"tokens.bin", "tokens.boundaries"}


def test_golden_manifest_keys_and_values() -> None:
    manifest = _manifest(GOLDEN / "token_store_u16")
    assert manifest["format"] == "packtool.tokens"
    assert manifest["format_version"] == 1
    for key in ("packtool_version", "tokenizer", "dtype", "n_documents", "n_tokens", "n_target_tokens", "files"):
        assert key in manifest, key
    assert manifest["dtype"] == "uint16"
    assert (manifest["n_documents"], manifest["n_tokens"], manifest["n_target_tokens"]) == (4, 10, 9)
    assert set(manifest["tokenizer"]) >= {"name", "sha256", "vocab_size", "bos_id", "eos_id", "pad_id"}
    assert list(manifest["files"]) == ["tokens.bin", "tokens.boundaries", "tokens.loss"]
    assert manifest["files"]["tokens.bin"]["bytes"] == 20
    assert manifest["files"]["tokens.boundaries"]["bytes"] == 32


def test_golden_store_opens_and_reads_back() -> None:
    ts = open_token_store(GOLDEN / "token_store_u16", check_hashes=True)
    assert ts.dtype == np.dtype("<u2") and ts.n_documents == 4 and ts.n_tokens == 10
    assert ts.lengths.tolist() == U16_LENGTHS.tolist()
    assert ts.document(1).size == 0
    assert ts.document(3).tolist() == [9, 300, 301, 302, 65534]
    assert ts.loss is not None and ts.loss.tolist() == U16_LOSS.tolist()
    big = open_token_store(GOLDEN / "token_store_u32", check_hashes=True)
    assert big.document(1).tolist() == [5, 2**32 - 1, 0] and big.loss is None


# ---------------------------------------------------------------- damaged token stores


def test_flipped_byte_is_caught_by_hashes(store: Path) -> None:
    data = bytearray((store / "tokens.bin").read_bytes())
    data[6] ^= 0xFF
    (store / "tokens.bin").write_bytes(bytes(data))
    open_token_store(store)  # same size: only the hash check can see it
    with pytest.raises(FormatError, match=r"tokens\.bin sha256 differs"):
        open_token_store(store, check_hashes=True)


@pytest.mark.parametrize("fname", ["tokens.bin", "tokens.boundaries", "tokens.loss"])
def test_truncated_file_names_the_file(store: Path, fname: str) -> None:
    data = (store / fname).read_bytes()
    (store / fname).write_bytes(data[:-1])
    with pytest.raises(FormatError, match=fname.replace(".", r"\.")) as info:
        open_token_store(store)
    assert "re-run" in str(info.value)


def test_missing_file_names_the_file(store: Path) -> None:
    (store / "tokens.boundaries").unlink()
    with pytest.raises(FormatError, match=r"tokens\.boundaries is missing"):
        open_token_store(store)


def test_future_format_version_is_refused(store: Path) -> None:
    _rewrite_manifest(store, format_version=2)
    with pytest.raises(FormatError, match=r"format_version 2 is not supported.*manifest\.json.*upgrade packtool"):
        open_token_store(store)


def test_unknown_dtype_is_refused(store: Path) -> None:
    _rewrite_manifest(store, dtype="int8")
    with pytest.raises(FormatError, match=r"unknown token dtype 'int8'.*manifest\.json"):
        open_token_store(store)


def test_non_json_manifest_names_the_file(store: Path) -> None:
    (store / "manifest.json").write_text('{"format": "packtool.tokens", ')
    with pytest.raises(FormatError, match=r"manifest\.json is not valid JSON"):
        open_token_store(store)


def test_wrong_format_name_is_refused(store: Path) -> None:
    _rewrite_manifest(store, format="something.else")
    with pytest.raises(FormatError, match=r"not a packtool token store manifest"):
        open_token_store(store)


def test_directory_without_manifest_is_not_a_store(store: Path) -> None:
    (store / "manifest.json").unlink()
    with pytest.raises(FormatError, match=r"no manifest\.json"):
        open_token_store(store)


def test_decreasing_boundaries_are_refused(store: Path) -> None:
    (store / "tokens.boundaries").write_bytes(np.array([5, 3, 3, 10], "<i8").tobytes())
    with pytest.raises(FormatError, match=r"not non-decreasing.*tokens\.boundaries"):
        open_token_store(store)


def test_last_boundary_must_equal_token_count(store: Path) -> None:
    (store / "tokens.boundaries").write_bytes(np.array([3, 3, 5, 9], "<i8").tobytes())
    with pytest.raises(FormatError, match=r"last document boundary 9 != n_tokens 10"):
        open_token_store(store)


def test_damaged_store_makes_the_cli_exit_1(store: Path) -> None:
    """Through the CLI: one `error:` line, exit 1, no traceback."""
    (store / "tokens.bin").write_bytes((store / "tokens.bin").read_bytes()[:-2])
    proc = subprocess.run([sys.executable, "-m", "packtool", "verify", str(store)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "tokens.bin" in lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("text", "message"), [
    (None, "field 'n_tokens' must be a count (an integer >= 0), got 'many'"),
    ("/dev/zero", "no manifest.json"),  # was read until a MemoryError by verify and stats
    ("sparse", "manifest.json is not read (it is 3,221,225,472 bytes, more than such a file holds"),
    ("[" * 100_000 + "]" * 100_000, "manifest.json is not valid JSON (nested too deep to read"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "manifest.json is not valid JSON (nested too deep to read"),
])
@pytest.mark.parametrize("command", ["verify", "pack", "stats"])
def test_hostile_manifest_values_are_one_line_through_every_reader(store: Path, tmp_path: Path, text: str | None,
                                                                   message: str, command: str) -> None:
    """A manifest with `"n_tokens": "many"` (ValueError in int()) or nested 100k deep (RecursionError) was a
    traceback through pack, stats and verify; `n_documents: -1` was "manifest implies -8 bytes"."""
    import resource

    if text is None:
        _rewrite_manifest(store, n_tokens="many")
    elif text == "/dev/zero":
        if not Path(text).exists():
            pytest.skip("no /dev/zero")
        (store / "manifest.json").unlink()
        (store / "manifest.json").symlink_to(text)
    elif text == "sparse":
        (store / "manifest.json").unlink()
        with open(store / "manifest.json", "wb") as fh:
            fh.truncate(3 << 30)  # nothing written
    else:
        (store / "manifest.json").write_text(text)
    if text == "/dev/zero":  # not a regular file: no manifest.json as far as any reader is concerned
        message = "no manifest.json"
    args = {"verify": [], "pack": ["--size", "8", "--output", str(tmp_path / "p")], "stats": []}[command]
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # noqa: E731 - the old code's MemoryError
    proc = subprocess.run([sys.executable, "-m", "packtool", command, str(store), *args], capture_output=True, text=True,
                          preexec_fn=limit, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("n_documents", -1, "field 'n_documents' must be a count (an integer >= 0), got -1"),
    ("n_tokens", True, "field 'n_tokens' must be a count (an integer >= 0), got True"),
    ("n_tokens", 2.5, "field 'n_tokens' must be a count"),
    ("files", [], "field 'files' must be a JSON object, got list"),
    ("tokenizer", "gpt2", "field 'tokenizer' must be a JSON object, got str"),
])
def test_manifest_fields_of_the_wrong_kind_are_named(store: Path, key: str, value: object, message: str) -> None:
    _rewrite_manifest(store, **{key: value})
    with pytest.raises(FormatError, match=re.escape(message)):
        open_token_store(store)


# ---------------------------------------------------------------- atomic writes


def test_atomic_directory_leaves_nothing_on_exception(tmp_path: Path) -> None:
    final = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_directory(final) as staging:
        (staging / "tokens.bin").write_bytes(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_keeps_the_old_store_on_exception(tmp_path: Path) -> None:
    final = tmp_path / "out"
    shutil.copytree(GOLDEN / "token_store_u16", final)
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    with pytest.raises(KeyboardInterrupt), atomic_directory(final) as staging:
        (staging / "manifest.json").write_text("{}")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before


def test_atomic_directory_replaces_whole_on_success(tmp_path: Path) -> None:
    final = tmp_path / "out"
    shutil.copytree(GOLDEN / "token_store_u16", final)
    with atomic_directory(final) as staging:
        write_case(staging, "token_store_u32")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert open_token_store(final, check_hashes=True).dtype == np.dtype("<u4")
    assert not (final / "tokens.loss").exists()


# ---------------------------------------------------------------- pack store


def _metadata(split: str, size: int = 8, **extra: object) -> dict:
    return {"split": split, "pack_size": size, "format_version": 1, "dtype": "uint16", **extra}


def test_write_metadata_line_replaces_a_split_and_keeps_order(tmp_path: Path) -> None:
    ps.write_metadata_line(tmp_path, _metadata("validation", n_packs=1))
    ps.write_metadata_line(tmp_path, _metadata("training", n_packs=2))
    ps.write_metadata_line(tmp_path, _metadata("training", n_packs=3))
    lines = (tmp_path / "8_metadata.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(x)["split"] for x in lines] == ["training", "validation"]
    assert ps.metadata_for(tmp_path, "training", 8)["n_packs"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["8_metadata.jsonl"]  # no temp file left behind


def test_metadata_future_version_and_missing_split(tmp_path: Path) -> None:
    ps.write_metadata_line(tmp_path, _metadata("training", format_version=99))
    with pytest.raises(FormatError, match=r"format_version 99 is not supported.*8_metadata\.jsonl"):
        ps.metadata_for(tmp_path, "training", 8)
    with pytest.raises(FormatError, match=r"no metadata line for split 'test'"):
        ps.metadata_for(tmp_path, "test", 8)


def test_metadata_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "8_metadata.jsonl").write_text(json.dumps(_metadata("training")) + "\n{oops\n")
    with pytest.raises(FormatError, match=r"8_metadata\.jsonl:2"):
        ps.read_metadata(tmp_path, 8)


def _write_pack_split(d: Path, arrays: dict[str, np.ndarray], tokens: np.ndarray, loss: np.ndarray | None = None) -> None:
    """A hand-made split (2 packs of 8, 3 segments) so that its CSR arrays can be made inconsistent."""
    d.mkdir(parents=True, exist_ok=True)
    np.save(d / ps.data_name("training", 8), tokens)
    for what, arr in arrays.items():
        np.save(d / ps.companion_name("training", 8, what), arr.astype(ps.COMPANIONS[what]))
    if loss is not None:
        np.save(d / ps.loss_name("training", 8), loss)
    names = ps.file_names("training", 8, loss is not None)
    ps.write_metadata_line(d, _metadata("training", n_packs=2, pad_id=1, files=ps.file_records(d, names)))


def _good_split() -> tuple[dict[str, np.ndarray], np.ndarray]:
    arrays = {
        "pack_offsets": np.array([0, 2, 3]),
        "seg_lens": np.array([5, 3, 6]),
        "seg_pad": np.array([0, 0, 0]),
        "seg_doc": np.array([0, 2, 1]),
        "seg_src": np.array([0, 9, 5]),
    }
    tokens = np.array([[1, 2, 3, 4, 5, 9, 9, 9], [6, 7, 8, 9, 10, 11, 1, 1]], "<u2")
    return arrays, tokens


def test_open_pack_split_accepts_consistent_arrays(tmp_path: Path) -> None:
    arrays, tokens = _good_split()
    _write_pack_split(tmp_path, arrays, tokens)
    split = ps.open_pack_split(tmp_path, "training", 8, check_hashes=True)
    assert split.n_packs == 2 and split.seg_lens.tolist() == [5, 3, 6] and split.loss is None


@pytest.mark.parametrize(
    ("what", "bad", "message"),
    [
        ("pack_offsets", np.array([0, 2]), r"pack_offsets is inconsistent"),
        ("pack_offsets", np.array([0, 2, 4]), r"pack_offsets is inconsistent"),
        ("pack_offsets", np.array([0, 3, 2]), r"pack_offsets is inconsistent"),
        ("pack_offsets", np.array([1, 2, 3]), r"pack_offsets is inconsistent"),
        ("seg_doc", np.array([0, 1]), r"training_8\.seg_doc\.npy has 2 entries, expected 3"),
        ("seg_pad", np.array([0, 0, 0, 0]), r"training_8\.seg_pad\.npy has 4 entries, expected 3"),
    ],
)
def test_open_pack_split_rejects_inconsistent_csr(tmp_path: Path, what: str, bad: np.ndarray, message: str) -> None:
    arrays, tokens = _good_split()
    arrays[what] = bad
    _write_pack_split(tmp_path, arrays, tokens)
    with pytest.raises(FormatError, match=message):
        ps.open_pack_split(tmp_path, "training", 8)


def test_open_pack_split_rejects_wrong_dtype_and_shapes(tmp_path: Path) -> None:
    arrays, tokens = _good_split()
    _write_pack_split(tmp_path / "a", arrays, tokens, loss=np.ones((2, 7), np.uint8))
    with pytest.raises(FormatError, match=r"training_8\.loss\.npy has shape"):
        ps.open_pack_split(tmp_path / "a", "training", 8)
    _write_pack_split(tmp_path / "b", arrays, tokens.astype("<i8"))
    with pytest.raises(FormatError, match=r"training_8\.npy has dtype int64"):
        ps.open_pack_split(tmp_path / "b", "training", 8)


def test_open_pack_split_detects_truncation_and_corruption(tmp_path: Path) -> None:
    arrays, tokens = _good_split()
    _write_pack_split(tmp_path, arrays, tokens)
    data_path = tmp_path / ps.data_name("training", 8)
    raw = bytearray(data_path.read_bytes())
    raw[-1] ^= 0x01
    data_path.write_bytes(bytes(raw))
    ps.open_pack_split(tmp_path, "training", 8)  # same size: only hashes see it
    with pytest.raises(FormatError, match=r"training_8\.npy sha256 differs"):
        ps.open_pack_split(tmp_path, "training", 8, check_hashes=True)
    data_path.write_bytes(bytes(raw[:-3]))
    with pytest.raises(FormatError, match=r"training_8\.npy does not match its recorded size.*truncated"):
        ps.open_pack_split(tmp_path, "training", 8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_stores_pass_verify(name: str) -> None:
    """The golden files are valid stores by every rule `packtool verify` checks (ids below vocab_size)."""
    from packtool import VerifyConfig, verify_path

    verify_path(VerifyConfig(GOLDEN / name))


# ---- the resumable writer: marks, hashes taken while writing, reopening at the last good mark ----


def _write_with_marks(directory: Path, parts: int = 4) -> tuple[list, list]:
    from packtool.formats.token_resume import resume_token_store

    rng = np.random.default_rng(5)
    writer, kept = resume_token_store(directory, np.dtype("<u4"), [], with_loss=True, with_rejects=True)
    assert kept == 0
    marks, chunks = [], []
    for i in range(parts):
        lengths = rng.integers(0, 50, size=7)
        ids = rng.integers(0, 2**20, size=int(lengths.sum()))
        loss = (rng.random(ids.size) < 0.8).astype(np.uint8)
        writer.append(ids, lengths, loss)
        writer.append_rejects(f'{{"line": {i}}}\n'.encode())
        marks.append(writer.mark())
        chunks.append((ids, lengths, loss, i))
    writer.close()
    return marks, chunks


def test_resume_keeps_the_marks_the_files_still_match_and_finishes_identically(tmp_path: Path) -> None:
    from packtool.formats.token_resume import resume_token_store
    from packtool.formats.token_store import StoreMark

    marks, chunks = _write_with_marks(tmp_path / "a")
    marks = [StoreMark.from_json(json.loads(json.dumps(m.to_json()))) for m in marks]  # as journaled
    (tmp_path / "ref").mkdir()
    one_go = TokenStoreWriter(tmp_path / "ref", np.dtype("<u4"), with_rejects=True)
    for ids, lengths, loss, i in chunks:
        one_go.append(ids, lengths, loss)
        one_go.append_rejects(f'{{"line": {i}}}\n'.encode())
    reference = one_go.finish({"x": 1})
    # damage the tokens written after the second mark: only two marks survive
    with open(tmp_path / "a" / "tokens.bin", "r+b") as fh:
        fh.seek(marks[2].files["tokens.bin"][0] - 1)
        fh.write(b"\xff")
    writer, kept = resume_token_store(tmp_path / "a", np.dtype("<u4"), marks, with_loss=True, with_rejects=True)
    assert kept == 2 and writer.n_tokens == marks[1].n_tokens
    for ids, lengths, loss, i in chunks[2:]:
        writer.append(ids, lengths, loss)
        writer.append_rejects(f'{{"line": {i}}}\n'.encode())
    resumed = writer.finish({"x": 1})
    assert resumed["files"] == reference["files"]  # sha256 taken while writing, across the resume
    for name in reference["files"]:
        data = (tmp_path / "a" / name).read_bytes()
        assert data == (tmp_path / "ref" / name).read_bytes()
        assert resumed["files"][name]["sha256"] == hashlib.sha256(data).hexdigest()


def test_resume_of_a_missing_or_short_file_starts_over(tmp_path: Path) -> None:
    from packtool.formats.token_resume import resume_token_store

    marks, _ = _write_with_marks(tmp_path / "a")
    (tmp_path / "a" / "tokens.boundaries").unlink()
    writer, kept = resume_token_store(tmp_path / "a", np.dtype("<u4"), marks, with_loss=True, with_rejects=True)
    writer.close()
    assert kept == 0 and (tmp_path / "a" / "tokens.bin").stat().st_size == 0
    with pytest.raises(FormatError, match="malformed store mark"):
        type(marks[0]).from_json({"files": 3})
