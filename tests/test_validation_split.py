"""`pack --validation F`: held-out documents chosen by a hash of their token content, in the same run.

Token-identical documents never straddle the splits (also across stores), a document's split does
not change when a store is added, held-out documents are taken before repetition, and the share is
F within 1% on a few thousand documents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import check_mixture_packs, cli, cli_error, make_store, write_store

from packtool.core.mixture import content_hashes, validation_threshold
from packtool.errors import FormatError
from packtool.formats.pack_store import metadata_for, read_metadata
from packtool.formats.token_store import open_token_store
from packtool.loader import PackedDataset
from packtool.stages.pack import PackConfig, pack_store
from packtool.stages.pack.mixture import held_out_of


def _flat(err: str) -> str:
    """A usage error as one line (typer boxes and wraps it)."""
    return " ".join(err.replace("│", " ").split())


N = 256
TOK = "org--tiny-tok"


def _docs(n: int, seed: int, vocab: int = 600) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(2, vocab, size=int(k)) for k in rng.integers(1, 60, size=n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """a: 3000 random documents; b: 1000 of its own plus 300 copies of a's; c: 800 more, 100 duplicated inside."""
    root = tmp_path_factory.mktemp("val")
    a = _docs(3000, 1)
    b = _docs(1000, 2) + [a[i] for i in range(0, 3000, 10)]
    c = _docs(700, 3)
    c = c + c[:100]
    return {
        "docs": {"a": a, "b": b, "c": c},
        "a": write_store(root / "a", a),
        "b": write_store(root / "b", b, loss=[np.ones(d.size, np.uint8) for d in b]),
        "c": write_store(root / "c", c),
    }


def _pack(out, *specs: str, flags: tuple[str, ...] = ()) -> str:
    code, stdout, err = cli("pack", *specs, "--size", str(N), "--output", str(out), "-q", *flags)
    assert code == 0, err
    return stdout


def _contents(corpus: dict, names: list[str], counts: list[np.ndarray]) -> set[bytes]:
    docs = corpus["docs"]
    return {docs[n][i].astype("<u8").tobytes() for n, c in zip(names, counts, strict=True) for i in np.flatnonzero(c)}


def _splits(corpus: dict, out, names: list[str]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    paths = [corpus[n] for n in names]
    d = out / "packed" / TOK
    _, train = check_mixture_packs(paths, d, "training", N)
    _, val = check_mixture_packs(paths, d, "validation", N)
    return train, val


def test_disjoint_by_content_and_within_the_fraction(corpus: dict, tmp_path) -> None:
    stdout = _pack(tmp_path / "o", str(corpus["a"]), str(corpus["b"]), flags=("--validation", "0.1"))
    assert "validation_256" in stdout
    train, val = _splits(corpus, tmp_path / "o", ["a", "b"])
    for t, v in zip(train, val, strict=True):
        assert not np.any((t > 0) & (v > 0)) and np.all(t + v == 1)  # each document in exactly one split, once
    assert not _contents(corpus, ["a", "b"], train) & _contents(corpus, ["a", "b"], val)
    share = sum(int(v.sum()) for v in val) / sum(v.size for v in val)
    assert abs(share - 0.1) < 0.01, share
    a_val = val[0]
    np.testing.assert_array_equal(val[1][1000:], a_val[::10])  # b's copies of a's documents follow a's split
    meta = metadata_for(tmp_path / "o" / "packed" / TOK, "validation", N)
    assert meta["mixture"]["validation"]["fraction"] == 0.1 and meta["mixture"]["part"] == "validation"
    assert [s["documents"] for s in meta["source"]] == [int(v.sum()) for v in val]


def test_split_is_stable_when_a_store_is_added(corpus: dict, tmp_path) -> None:
    _pack(tmp_path / "ab", str(corpus["a"]), str(corpus["b"]), flags=("--validation", "0.2"))
    _pack(tmp_path / "abc", str(corpus["a"]), str(corpus["b"]), str(corpus["c"]), flags=("--validation", "0.2"))
    _, v2 = _splits(corpus, tmp_path / "ab", ["a", "b"])
    _, v3 = _splits(corpus, tmp_path / "abc", ["a", "b", "c"])
    np.testing.assert_array_equal(v2[0], v3[0])
    np.testing.assert_array_equal(v2[1], v3[1])
    c_val = v3[2]
    np.testing.assert_array_equal(c_val[700:], c_val[:100])  # duplicates inside a store: one split


def test_validation_is_taken_before_repetition(corpus: dict, tmp_path) -> None:
    _pack(tmp_path / "o", f"{corpus['a']}:3", f"{corpus['c']}:0.5", flags=("--validation", "0.1"))
    train, val = _splits(corpus, tmp_path / "o", ["a", "c"])
    assert set(np.unique(train[0])) == {0, 3} and set(np.unique(val[0])) == {0, 1}
    assert np.all((train[0] == 3) != (val[0] == 1))  # a held-out document is never upsampled into training
    assert not np.any((train[1] > 0) & (val[1] > 0))
    held_c = int(val[1].sum())
    assert train[1].sum() == int(np.floor(0.5 * (800 - held_c) + 0.5))  # the fraction is of c's training documents


def test_both_splits_deterministic_and_verified(corpus: dict, tmp_path) -> None:
    for name in ("1", "2"):
        _pack(tmp_path / name, str(corpus["a"]), str(corpus["b"]), flags=("--validation", "0.05"))
    d1, d2 = (tmp_path / n / "packed" / TOK for n in ("1", "2"))
    assert {p.name: p.read_bytes() for p in d1.iterdir()} == {p.name: p.read_bytes() for p in d2.iterdir()}
    code, stdout, err = cli("verify", str(tmp_path / "1"), "--source", str(corpus["a"]), "--source", str(corpus["b"]))
    assert code == 0 and "training_256" in stdout and "validation_256" in stdout, err
    builds = {metadata_for(d1, s, N)["build"] for s in ("training", "validation")}
    assert len(builds) == 2


def test_loader_reads_both_splits(corpus: dict, tmp_path) -> None:
    _pack(tmp_path / "o", str(corpus["a"]), str(corpus["b"]), flags=("--validation", "0.1"))
    train = PackedDataset(tmp_path / "o", split="training")
    val = PackedDataset(tmp_path / "o", split="validation")
    assert len(train) > len(val) > 0
    item = val[0]
    assert item["input_ids"].shape == (N,) and int(item["cu_seqlens"][-1]) == N


def test_training_split_name_and_bad_fractions(corpus: dict, tmp_path) -> None:
    _pack(tmp_path / "o", str(corpus["c"]), flags=("--validation", "0.3", "--split", "test"))
    d = tmp_path / "o" / "packed" / TOK
    assert metadata_for(d, "test", N)["mixture"]["part"] == "training"
    assert metadata_for(d, "validation", N)["n_documents"] > 0
    line = cli_error("pack", str(corpus["c"]), "--validation", "0.3", "--split", "validation", "--size", str(N),
                     "--output", str(tmp_path / "x"), code=2)
    assert "--split validation" in line
    for bad in ("0", "1", "1.5", "-0.1"):
        line = cli_error("pack", str(corpus["c"]), "--validation", bad, "--size", str(N), "--output",
                         str(tmp_path / "x"), code=2)
        assert "strictly between 0 and 1" in line
    assert not (tmp_path / "x").exists()


def test_content_hash_does_not_depend_on_dtype(tmp_path) -> None:
    docs = _docs(200, 9)
    u16 = open_token_store(write_store(tmp_path / "u16", docs))
    u32 = open_token_store(write_store(tmp_path / "u32", docs, vocab=70_000))
    assert u16.dtype.itemsize == 2 and u32.dtype.itemsize == 4
    h16 = content_hashes(u16.tokens, u16.starts, u16.lengths)
    h32 = content_hashes(u32.tokens, u32.starts, u32.lengths)
    np.testing.assert_array_equal(h16, h32)
    assert np.unique(h16).size == 200  # distinct documents, distinct hashes
    one = open_token_store(make_store(tmp_path / "m", np.array([5, 5, 0, 0])))
    hm = content_hashes(one.tokens, one.starts, one.lengths)
    assert hm[2] == hm[3] and hm[0] != hm[1]  # empty documents agree; random ids differ
    assert validation_threshold(0.5) == np.uint64(2**63)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fraction=st.floats(0.01, 0.9),
    weights=st.tuples(st.floats(0.1, 2.5), st.floats(0.1, 2.5)),
    seed=st.integers(0, 3),
)
def test_property_validation_invariants(
    corpus: dict, tmp_path_factory: pytest.TempPathFactory, fraction: float, weights: tuple[float, float], seed: int
) -> None:
    """Every document in exactly one split; validation once, training k or k+1 times; same content, same split."""
    out = tmp_path_factory.mktemp("vprop")
    pack_store(PackConfig((corpus["b"], corpus["c"]), N, out, weights=weights, validation=fraction, seed=seed, workers=1))
    train, val = _splits(corpus, out, ["b", "c"])
    for t, v, w in zip(train, val, weights, strict=True):
        k = int(np.floor(w))
        assert set(np.unique(v)) <= {0, 1} and set(np.unique(t[v == 0])) <= {k, k + 1} and not t[v == 1].any()
        if k >= 1:
            assert np.all((t > 0) | (v > 0))
    assert not _contents(corpus, ["b", "c"], train) & _contents(corpus, ["b", "c"], val)


def test_a_plain_repack_drops_the_validation_split_it_would_overlap(corpus: dict, tmp_path: Path) -> None:
    """`pack --validation`, then `pack` of the same split without it: every held-out document is in the new
    training split, so the old validation split goes in the same commit (files and alias too)."""
    out = tmp_path / "o"
    _pack(out, str(corpus["c"]), flags=("--validation", "0.3"))
    d = next((out / "packed").iterdir())
    assert metadata_for(d, "validation", N) is not None
    _pack(out, str(corpus["c"]), flags=("--split", "test"))  # another split: the pair stays
    assert metadata_for(d, "validation", N)["mixture"]["validation"]["training_split"] == "training"
    _pack(out, str(corpus["c"]))  # rewrites training without --validation
    assert [r["split"] for r in read_metadata(d, N)] == ["training", "test"]
    assert not [p.name for p in d.iterdir() if p.name.startswith("validation_")]
    code, _, err = cli("verify", str(d), "--source", str(corpus["c"]), "-q")
    assert code == 0, err
    with pytest.raises(FormatError):
        PackedDataset(d, split="validation", size=N)


def test_validation_of_another_split_does_not_replace_a_paired_one(corpus: dict, tmp_path: Path) -> None:
    """`pack --validation` (training), then `pack --validation --split test` into the same ROOT: the second run
    would replace validation_N, held out of training_N, by one held out of test_N, leaving training_N beside a
    validation split that is not held out of it. It is refused (exit 1, nothing changed); once training is
    re-packed without --validation (which drops its validation split), the test run goes through."""
    out = tmp_path / "o"
    _pack(out, str(corpus["c"]), flags=("--validation", "0.3"))
    d = next((out / "packed").iterdir())
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    line = cli_error("pack", str(corpus["c"]), "--size", str(N), "--output", str(out), "--validation", "0.3",
                     "--split", "test")
    assert f"held out of training_{N}" in line and "--split test" in line
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    _pack(out, str(corpus["c"]), flags=("--validation", "0.2"))  # its own training split: replaced as before
    _pack(out, str(corpus["c"]))  # training without --validation: the validation split goes
    _pack(out, str(corpus["c"]), flags=("--validation", "0.3", "--split", "test"))
    owners = {r["split"]: held_out_of(r) for r in read_metadata(d, N)}
    assert owners == {"training": None, "test": None, "validation": "test"}
