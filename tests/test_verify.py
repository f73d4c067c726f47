"""`packtool verify` through the CLI: real stores from `packtool tokenize` + `packtool pack` pass (with and
without --source, every algorithm and policy, chat loss, --pad-multiple), and each kind of damage makes
it exit 1 with one `error:` line naming the reason. Damage that keeps sizes (and, where said, hashes)
consistent shows that the specific check, not an earlier one, catches it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import build_file, cli, cli_error, zipf_texts

from packtool import VerifyConfig, verify_path
from packtool.errors import FormatError
from packtool.formats.pack_store import (
    data_name,
    file_records,
    metadata_for,
    metadata_name,
    write_metadata_line,
)

N = 128




def passes(*args: str) -> str:
    code, out, err = cli("verify", *args, "--quiet")
    assert code == 0, err
    assert out.startswith("ok: ")
    return out


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def text_store(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> Path:
    """Zipf-length texts (a long tail past N), plus empty documents (no EOS, so they stay empty)."""
    d = tmp_path_factory.mktemp("text")
    texts = zipf_texts(300, seed=11)
    texts[5] = texts[77] = ""
    src = _jsonl(d / "in.jsonl", [{"text": t} for t in texts])
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(d / "store"),
                       "--no-eos", "--workers", "1", "-q")
    assert code == 0, err
    return d / "store"


@pytest.fixture(scope="module")
def chat_store(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> Path:
    """Chat conversations: loss only on assistant turns, so the store has tokens.loss."""
    d = tmp_path_factory.mktemp("chat")
    texts = zipf_texts(400, seed=5)
    rows = [{"messages": [{"role": "user", "content": texts[2 * i]}, {"role": "assistant", "content": texts[2 * i + 1]}]}
            for i in range(150)]
    src = _jsonl(d / "chat.jsonl", rows)
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(d / "store"),
                       "--format", "chat", "--workers", "1", "-q")
    assert code == 0, err
    return d / "store"


def pack(store: Path, out: Path, *args: str) -> Path:
    code, _, err = cli("pack", str(store), "--size", str(N), "--output", str(out), "--quiet", *args)
    assert code == 0, err
    (directory,) = (out / "packed").iterdir()
    return directory


@pytest.fixture
def packed(tmp_path: Path, chat_store: Path) -> Path:
    """A fresh chat pack store (with loss and --pad-multiple padding) to damage."""
    return pack(chat_store, tmp_path / "out", "--pad-multiple", "4")


def refresh_hashes(directory: Path, split: str = "training", size: int = N) -> None:
    """Re-record sizes and sha256 after a deliberate edit, so only a deeper check can see it."""
    meta = metadata_for(directory, split, size)
    meta["files"] = file_records(directory, list(meta["files"]))
    write_metadata_line(directory, meta)


def edit_npy(path: Path, change) -> None:  # noqa: ANN001 - a callable editing the array in place
    arr = np.load(path)
    change(arr)
    np.save(path, arr)


# ---------------------------------------------------------------- valid stores pass


@pytest.mark.parametrize("args", [
    ("--algorithm", "ffd"),
    ("--algorithm", "bfd", "--overlong", "truncate"),
    ("--algorithm", "mffd", "--overlong", "drop"),
    ("--algorithm", "ffs", "--pad-multiple", "8", "--max-docs-per-pack", "6"),
    ("--algorithm", "concat", "--no-shuffle", "--overlong", "split", "--pad-multiple", "3"),
])
def test_packed_text_store_verifies_with_and_without_source(tmp_path: Path, text_store: Path, args: tuple[str, ...]) -> None:
    directory = pack(text_store, tmp_path / "out", *args)
    assert "training_128: " in passes(str(tmp_path / "out"))
    out = passes(str(directory), "--source", str(text_store))
    assert "round-trips" in out
    passes(str(directory / data_name("training", N)), "--source", str(text_store))


def test_chat_store_with_loss_and_every_split_verify(tmp_path: Path, chat_store: Path) -> None:
    out = tmp_path / "out"
    pack(chat_store, out, "--pad-multiple", "4")
    pack(chat_store, out, "--split", "validation", "--overlong", "truncate")
    directory = pack(chat_store, out, "--split", "test", "--overlong", "drop", "--algorithm", "bfd")
    assert build_file(directory, N, "loss").exists()
    report = verify_path(VerifyConfig(directory, chat_store))
    assert [line.split(":")[0] for line in report.checked] == ["training_128", "validation_128", "test_128"]
    assert "token store" in passes(str(chat_store))


def test_token_store_checks_id_bound_and_target_count(tmp_path: Path, text_store: Path) -> None:
    store = Path(shutil.copytree(text_store, tmp_path / "s"))
    manifest = json.loads((store / "manifest.json").read_text())
    good = json.loads((store / "manifest.json").read_text())
    manifest["tokenizer"]["vocab_size"] = 10  # ids of the real tokenizer go far beyond
    (store / "manifest.json").write_text(json.dumps(manifest))
    line = cli_error("verify", str(store))
    assert "expected < 10" in line and "tokens.bin" in line
    good["n_target_tokens"] = good["n_tokens"] - 1
    (store / "manifest.json").write_text(json.dumps(good))
    assert "n_target_tokens" in cli_error("verify", str(store))


# ---------------------------------------------------------------- damage: each exits 1 with one line


def test_flipped_byte_in_packs_is_a_sha_mismatch(packed: Path) -> None:
    path = build_file(packed, N)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x5A
    path.write_bytes(bytes(data))
    line = cli_error("verify", str(packed))
    assert f"{build_file(packed, N).name} sha256 differs" in line and "re-run `packtool pack`" in line


def test_truncated_companion_is_named(packed: Path) -> None:
    path = build_file(packed, N, "seg_lens")
    path.write_bytes(path.read_bytes()[:-4])
    assert f"{build_file(packed, N, 'seg_lens').name} does not match its recorded size" in cli_error("verify", str(packed))


@pytest.mark.parametrize("dtype", [">u2", "<u4"])
def test_wrong_dtype_with_updated_hashes_is_caught_by_the_dtype_check(packed: Path, dtype: str) -> None:
    """Big-endian uint16 has the same size and values, uint32 has updated sizes: hashes agree, dtype does not."""
    path = build_file(packed, N)
    np.save(path, np.load(path).astype(dtype))
    refresh_hashes(packed)
    line = cli_error("verify", str(packed))
    assert f"{build_file(packed, N).name} has dtype" in line and "uint16" in line


def test_swapped_tokens_are_caught_only_with_source(packed: Path, chat_store: Path) -> None:
    path = build_file(packed, N)
    offsets = np.load(build_file(packed, N, "pack_offsets"))
    lens = np.load(build_file(packed, N, "seg_lens")) - np.load(build_file(packed, N, "seg_pad"))
    row = np.load(path)[0]
    a, b = 0, int(lens[offsets[0]]) - 1  # first and last real token of the first segment of pack 0
    assert row[a] != row[b]

    def swap(arr: np.ndarray) -> None:
        arr[0, a], arr[0, b] = arr[0, b], arr[0, a]

    edit_npy(path, swap)
    refresh_hashes(packed)
    passes(str(packed))  # every invariant of the packs alone still holds
    line = cli_error("verify", str(packed), "--source", str(chat_store))
    assert f"pack 0 segment {int(offsets[0])}" in line and "holds token" in line and build_file(packed, N).name in line


def test_source_must_be_the_store_the_packs_came_from(packed: Path, text_store: Path) -> None:
    assert "packs were made from another token store" in cli_error("verify", str(packed), "--source", str(text_store))


def test_a_source_given_more_often_than_listed_is_refused(packed: Path, chat_store: Path) -> None:
    """`--source S --source S` on a store packed from S once said every document of "S, S" round-trips."""
    line = cli_error("verify", str(packed), "--source", str(chat_store), "--source", str(chat_store))
    assert f"--source {chat_store} is given 2 times but training_{N} lists that store 1 time" in line


def test_source_on_a_token_store_is_a_usage_error(chat_store: Path) -> None:
    line = cli_error("verify", str(chat_store), "--source", str(chat_store), code=2)
    assert "--source applies to a pack store" in line


def test_token_store_manifest_not_matching_its_files(tmp_path: Path, chat_store: Path) -> None:
    store = Path(shutil.copytree(chat_store, tmp_path / "s"))
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["files"]["tokens.loss"]["sha256"] = "0" * 64
    (store / "manifest.json").write_text(json.dumps(manifest))
    assert "tokens.loss sha256 differs from its record" in cli_error("verify", str(store))


def test_pack_metadata_counts_must_match_the_arrays(packed: Path) -> None:
    meta = metadata_for(packed, "training", N)
    meta["n_tokens"] += 1
    write_metadata_line(packed, meta)
    line = cli_error("verify", str(packed))
    assert "metadata n_tokens" in line and metadata_name(N) in line


def test_non_pad_id_in_the_tail_is_caught(packed: Path) -> None:
    meta = metadata_for(packed, "training", N)
    used = np.add.reduceat(np.load(build_file(packed, N, "seg_lens")), np.load(build_file(packed, N, "pack_offsets"))[:-1])
    p = int(np.argmin(used))
    assert used[p] < N

    def poke(arr: np.ndarray) -> None:
        arr[p, N - 1] = meta["pad_id"] + 1

    edit_npy(build_file(packed, N), poke)
    refresh_hashes(packed)
    assert f"pack {p} column {N - 1} (tail padding)" in cli_error("verify", str(packed))


def test_loss_on_pad_multiple_padding_is_caught(packed: Path) -> None:
    offsets = np.load(build_file(packed, N, "pack_offsets"))
    lens, pad = np.load(build_file(packed, N, "seg_lens")), np.load(build_file(packed, N, "seg_pad"))
    j = int(np.flatnonzero(pad)[0])
    p = int(np.searchsorted(offsets, j, side="right")) - 1
    col = int(lens[offsets[p]:j + 1].sum()) - 1  # last padding position of segment j

    def poke(arr: np.ndarray) -> None:
        arr[p, col] = 1

    edit_npy(build_file(packed, N, "loss"), poke)
    refresh_hashes(packed)
    line = cli_error("verify", str(packed))
    assert f"pack {p} column {col} holds loss 1, expected 0 (padding)" in line and build_file(packed, N, "loss").name in line


def test_moved_segment_source_breaks_coverage(packed: Path, chat_store: Path) -> None:
    def shift(arr: np.ndarray) -> None:
        arr[0] += 1

    edit_npy(build_file(packed, N, "seg_src"), shift)
    refresh_hashes(packed)
    passes(str(packed))
    assert "duplicated, overlapping or missing fragment" in cli_error("verify", str(packed), "--source", str(chat_store))


def test_overfull_pack_is_caught(packed: Path) -> None:
    def grow(arr: np.ndarray) -> None:
        arr[0] += N

    edit_npy(build_file(packed, N, "seg_lens"), grow)
    refresh_hashes(packed)
    assert f"of at most {N} tokens" in cli_error("verify", str(packed))


def test_bad_paths_exit_1(tmp_path: Path) -> None:
    assert "no token store or pack store" in cli_error("verify", str(tmp_path / "nowhere"))
    with pytest.raises(FormatError, match="no token store or pack store"):
        verify_path(VerifyConfig(tmp_path))
