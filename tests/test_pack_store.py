"""`packtool pack` through the CLI and `pack_store`: every document exactly once, no pack over size,
determinism, seeds, --overlong policies, --pad-multiple, --max-docs-per-pack, loss alignment,
metadata as JSON Lines, and refusal of a broken token store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import EOS, PAD, check_packs, cli, make_store, zipf_lengths

from packtool import PackConfig, pack_store
from packtool.choices import Algorithm, Overlong
from packtool.errors import ConfigError
from packtool.formats.pack_store import open_pack_split
from packtool.formats.token_store import open_token_store


def run_pack(store: Path, out: Path, *args: str) -> tuple[int, str]:
    code, out_, err = cli("pack", str(store), "--output", str(out), "--quiet", *args)
    return code, out_ + err


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


def test_pad_multiple_larger_than_size_is_a_usage_error(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", np.array([3, 4]))
    code, out = run_pack(store, tmp_path / "out", "--size", "8", "--pad-multiple", "16")
    assert code == 2 and "--pad-multiple 16" in out  # contradictory flags


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
    build = json.loads((tmp_path / "a/packed/org--tiny-tok/128_metadata.jsonl").read_text())["build"]
    assert set(a) == {"128_metadata.jsonl", "training_128.npy"} | {
        f"training_128.{build}{role}.npy"
        for role in ("", ".loss", ".pack_offsets", ".seg_lens", ".seg_pad", ".seg_doc", ".seg_src")
    }
    assert a["training_128.npy"] == a[f"training_128.{build}.npy"]  # the plain alias: np.load works on it
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
