"""`packtool pack` through the CLI and `pack_store`: every document exactly once, no pack over size,
determinism, seeds, --overlong policies, --pad-multiple, --max-docs-per-pack, loss alignment,
metadata as JSON Lines, and refusal of a broken token store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from packtool import PackConfig, pack_store
from packtool.choices import Algorithm, Overlong
from packtool.core.packing.segments import build_segments
from packtool.errors import ConfigError
from packtool.formats.pack_store import open_pack_split
from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id, open_token_store

PAD, EOS = 1, 0


def zipf_lengths(n: int, seed: int = 0, cap: int = 300) -> np.ndarray:
    """Many short documents, a long tail, and a few empty ones."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.5, size=n) * 3, cap).astype(np.int64)
    lengths[rng.choice(n, size=max(1, n // 50), replace=False)] = 0
    return lengths


def make_store(path: Path, lengths: np.ndarray, *, vocab: int = 600, with_loss: bool = False, seed: int = 0,
               pad_id: int | None = PAD) -> Path:
    """A token store written with the format module (random ids, optional loss mask)."""
    rng = np.random.default_rng(seed)
    total = int(np.sum(lengths))
    ids = rng.integers(2, vocab, size=total)
    loss = (rng.random(total) < 0.7).astype(np.uint8) if with_loss else None
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, dtype_for_max_id(vocab - 1))
    writer.append(ids, np.asarray(lengths), loss)
    writer.finish({"packtool_version": "test", "tokenizer": {"name": "org/tiny-tok", "sha256": "0" * 64,
                   "vocab_size": vocab, "bos_id": None, "eos_id": EOS, "pad_id": pad_id}})
    return path


def cli(*args: str) -> tuple[int, str]:
    """The real entry point in-process: exit code and stdout+stderr."""
    code, out, err = run_cli(list(args))
    return code, out + err


def run_pack(store: Path, out: Path, *args: str) -> tuple[int, str]:
    return cli("pack", str(store), "--output", str(out), "--quiet", *args)


def check_packs(store_dir: Path, pack_dir: Path, split: str, size: int) -> dict:
    """The shared invariant checker: rows are real segments, no pack over size, pad elsewhere,
    every non-empty document exactly once (as its fragments, in order) with identical tokens."""
    store = open_token_store(store_dir)
    ps = open_pack_split(pack_dir, split, size, check_hashes=True)
    meta = ps.metadata
    pad_id = meta["pad_id"]
    po = np.asarray(ps.pack_offsets)
    lens = np.asarray(ps.seg_lens, np.int64)
    seg_pad = np.asarray(ps.seg_pad, np.int64)
    real = lens - seg_pad
    per_pack = np.add.reduceat(lens, po[:-1]) if ps.n_packs else np.zeros(0)
    assert np.all(per_pack <= size)
    if meta["max_docs_per_pack"]:
        assert np.diff(po).max() <= meta["max_docs_per_pack"]
    # reconstruct each segment's tokens from the pack rows, compare with the source
    flat = np.asarray(ps.tokens).reshape(-1)
    row = np.repeat(np.arange(ps.n_packs), np.diff(po))
    within = np.cumsum(lens) - lens - np.repeat((np.cumsum(lens) - lens)[po[:-1]], np.diff(po))
    dst = row * size + within
    covered = np.zeros(flat.size, bool)
    for i in range(lens.size):  # test code: clarity over speed
        d, s, r = dst[i], ps.seg_src[i], real[i]
        np.testing.assert_array_equal(flat[d:d + r], store.tokens[s:s + r])
        assert np.all(flat[d + r:d + lens[i]] == pad_id)
        covered[d:d + lens[i]] = True
        if ps.loss is not None:
            lf = np.asarray(ps.loss).reshape(-1)
            np.testing.assert_array_equal(lf[d:d + r], store.loss[s:s + r])
            assert not lf[d + r:d + lens[i]].any()
    assert np.all(flat[~covered] == pad_id)
    if ps.loss is not None:
        assert not np.asarray(ps.loss).reshape(-1)[~covered].any()
    # documents: each appears exactly once (split: consecutive fragments covering it)
    lengths = store.lengths
    key = np.lexsort((np.asarray(ps.seg_src), np.asarray(ps.seg_doc)))
    doc, src, rl = np.asarray(ps.seg_doc)[key], np.asarray(ps.seg_src)[key], real[key]
    policy = meta["overlong"]["policy"]
    cap = size // meta["pad_multiple"] * meta["pad_multiple"]
    expect = build_segments(store.starts, lengths, size, policy, meta["pad_multiple"])
    np.testing.assert_array_equal(doc, expect.doc)
    np.testing.assert_array_equal(src, expect.src)
    np.testing.assert_array_equal(rl, expect.real)
    covered_tokens = np.bincount(doc, weights=rl, minlength=lengths.size).astype(np.int64)
    if policy == "split":
        np.testing.assert_array_equal(covered_tokens, lengths)
    else:
        ok = lengths <= cap
        np.testing.assert_array_equal(covered_tokens[ok], lengths[ok])
    assert meta["n_tokens"] == int(real.sum())
    assert meta["n_packs"] == ps.n_packs >= meta["lower_bound_packs"]
    return meta


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("size", [64, 257])
def test_every_algorithm_places_every_document_once(tmp_path: Path, algorithm: Algorithm, size: int) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(400, seed=size))
    code, out = run_pack(store, tmp_path / "out", "--size", str(size), "--algorithm", algorithm.value)
    assert code == 0, out
    meta = check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", size)
    assert meta["algorithm"] == algorithm.value
    assert meta["n_empty_documents"] == int(np.sum(zipf_lengths(400, seed=size) == 0))


@pytest.mark.parametrize("policy", ["truncate", "split", "drop"])
def test_overlong_policies(tmp_path: Path, policy: str) -> None:
    lengths = np.array([10, 500, 0, 64, 65, 3, 200, 1])
    store = make_store(tmp_path / "tok", lengths)
    code, out = run_pack(store, tmp_path / "out", "--size", "64", "--overlong", policy)
    assert code == 0, out
    meta = check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 64)
    assert meta["overlong"] == {"policy": policy, "count": 3}
    expected_tokens = {"split": lengths.sum(), "truncate": 10 + 64 * 4 + 3 + 1, "drop": 10 + 64 + 3 + 1}[policy]
    assert meta["n_tokens"] == expected_tokens
    assert meta["n_segments"] == {"split": 1 + 8 + 1 + 2 + 1 + 4 + 1, "truncate": 7, "drop": 4}[policy]


def test_overlong_error_names_document_and_fix(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([3, 4, 100, 5]))
    code, out = run_pack(store, tmp_path / "out", "--size", "32", "--overlong", "error")
    assert code == 1
    assert "document 2 has 100 tokens" in out and "--overlong" in out
    assert not (tmp_path / "out/packed/org--tiny-tok/32_metadata.jsonl").exists()


def test_pad_multiple_rounds_segments_and_counts_against_size(tmp_path: Path) -> None:
    lengths = zipf_lengths(300, seed=3)
    lengths[5] = 70  # longer than 60 // 8 * 8 = 56 -> fragments of 56 and 14 (+2 pad)
    store = make_store(tmp_path / "tok", lengths)
    code, out = run_pack(store, tmp_path / "out", "--size", "60", "--pad-multiple", "8")
    assert code == 0, out
    meta = check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 60)
    ps = open_pack_split(tmp_path / "out/packed/org--tiny-tok", "training", 60)
    assert np.all(np.asarray(ps.seg_lens) % 8 == 0)
    assert np.all(np.asarray(ps.seg_pad) < 8)
    assert sorted(np.asarray(ps.seg_lens)[np.asarray(ps.seg_doc) == 5].tolist()) == [16, 56]
    assert meta["pad_multiple"] == 8 and meta["dataset_max_seqlen"] <= 56


def test_pad_multiple_larger_than_size_is_a_config_error(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([3, 4]))
    code, out = run_pack(store, tmp_path / "out", "--size", "8", "--pad-multiple", "16")
    assert code == 1 and "--pad-multiple 16" in out


def test_max_docs_per_pack(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.full(200, 3))
    code, out = run_pack(store, tmp_path / "out", "--size", "128", "--max-docs-per-pack", "5")
    assert code == 0, out
    meta = check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 128)
    assert meta["max_samples_per_bin"] == 5 and meta["n_packs"] == 40 == meta["lower_bound_packs"]


def test_deterministic_bytes_and_seeds_differ(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(500, seed=7), with_loss=True)

    def files(out: Path) -> dict[str, bytes]:
        d = out / "packed/org--tiny-tok"
        return {p.name: p.read_bytes() for p in sorted(d.iterdir())}

    for name, seed in (("a", "1"), ("b", "1"), ("c", "2")):
        code, out = run_pack(store, tmp_path / name, "--size", "128", "--seed", seed)
        assert code == 0, out
    a, b, c = files(tmp_path / "a"), files(tmp_path / "b"), files(tmp_path / "c")
    assert a == b
    assert a["training_128.npy"] != c["training_128.npy"]
    assert set(a) == {"128_metadata.jsonl", "training_128.npy", "training_128.loss.npy", "training_128.pack_offsets.npy",
                      "training_128.seg_lens.npy", "training_128.seg_pad.npy", "training_128.seg_doc.npy",
                      "training_128.seg_src.npy"}
    assert not [p for p in (tmp_path / "a").rglob(".*")], "temp files left behind"


def test_loss_alignment_and_big_vocab(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(300, seed=11), vocab=70_000, with_loss=True)
    assert open_token_store(store).dtype.itemsize == 4
    code, out = run_pack(store, tmp_path / "out", "--size", "96", "--pad-multiple", "4")
    assert code == 0, out
    meta = check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 96)
    assert meta["dtype"] == "uint32"
    ps = open_pack_split(tmp_path / "out/packed/org--tiny-tok", "training", 96)
    assert ps.loss is not None and ps.loss.shape == ps.tokens.shape and ps.tokens.dtype == np.uint32


def test_metadata_jsonl_and_repack_replaces_line(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(200, seed=5), with_loss=True)
    for split in ("validation", "training", "validation"):
        code, out = run_pack(store, tmp_path / "out", "--size", "64", "--split", split)
        assert code == 0, out
    lines = (tmp_path / "out/packed/org--tiny-tok/64_metadata.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["split"] for r in records] == ["training", "validation"]
    rec = records[0]
    for key in ("pack_size", "max_samples_per_bin", "dataset_max_seqlen", "min_packed_seqlen", "packing_factor",
                "packing_efficiency", "algorithm", "seed", "tokenizer", "source", "n_documents", "n_segments",
                "n_packs", "n_tokens", "n_pad_tokens", "lower_bound_packs", "overlong", "format_version",
                "packtool_version", "files", "pad_id", "dtype", "n_empty_documents"):
        assert key in rec, key
    assert rec["n_pad_tokens"] + rec["n_tokens"] == rec["n_packs"] * 64
    assert rec["packing_factor"] == round(rec["n_segments"] / rec["n_packs"], 2)
    assert rec["pad_id"] == PAD and rec["tokenizer"]["name"] == "org/tiny-tok"
    # re-pack without loss removes the stale loss file and keeps the other split
    store2 = make_store(tmp_path / "tok2", zipf_lengths(50, seed=6))
    code, out = run_pack(store2, tmp_path / "out", "--size", "64", "--split", "validation")
    assert code == 0, out
    check_packs(store2, tmp_path / "out/packed/org--tiny-tok", "validation", 64)
    check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 64)
    assert not (tmp_path / "out/packed/org--tiny-tok/validation_64.loss.npy").exists()


def test_pad_id_falls_back_to_eos(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([5, 7, 9]), pad_id=None)
    meta = pack_store(PackConfig(store, 16, tmp_path / "out")).metadata
    assert meta["pad_id"] == EOS
    check_packs(store, tmp_path / "out/packed/org--tiny-tok", "training", 16)


def test_empty_store_and_all_dropped(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([0, 0, 100]))
    meta = pack_store(PackConfig(store, 16, tmp_path / "out", overlong=Overlong.DROP)).metadata
    assert meta["n_packs"] == 0 and meta["n_empty_documents"] == 2 and meta["overlong"]["count"] == 1
    ps = open_pack_split(tmp_path / "out/packed/org--tiny-tok", "training", 16, check_hashes=True)
    assert ps.tokens.shape == (0, 16)


def test_refuses_corrupted_or_truncated_store(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(100))
    raw = bytearray((store / "tokens.bin").read_bytes())
    raw[10] ^= 0xFF
    (store / "tokens.bin").write_bytes(bytes(raw))
    code, out = run_pack(store, tmp_path / "out", "--size", "64")
    assert code == 1 and "sha256" in out and out.count("\n") == 1
    (store / "tokens.bin").write_bytes(bytes(raw[:-2]))
    code, out = run_pack(store, tmp_path / "out", "--size", "64")
    assert code == 1 and "tokens.bin" in out
    code, out = run_pack(tmp_path / "nope", tmp_path / "out", "--size", "64")
    assert code == 1 and "does not exist" in out


def test_bad_max_docs_per_pack(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([3]))
    with pytest.raises(ConfigError, match="max-docs-per-pack"):
        pack_store(PackConfig(store, 16, tmp_path / "out", max_docs_per_pack=0))
