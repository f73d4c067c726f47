"""Mixtures: `packtool pack A[:W] B[:W] ...` packs several token stores of one tokenizer into one pack store.

The weight counts epochs: every document `floor(W)` times plus `round(frac(W) * n)` seeded documents
once more. Checked through the CLI with the shared mixture checker (`support.check_mixture_packs`),
which finds every segment's tokens in the right store independently of the packer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import (
    check_mixture_packs,
    check_packs,
    cli,
    cli_error,
    make_store,
    write_store,
    zipf_lengths,
)

from packtool.formats.pack_store import metadata_for, open_pack_split
from packtool.stages.pack import PackConfig, pack_store, parse_store_spec


def _flat(err: str) -> str:
    """A usage error as one line (typer boxes and wraps it)."""
    return " ".join(err.replace("│", " ").split())


N = 128
TOK = "org--tiny-tok"


def _lengths(n: int, seed: int) -> np.ndarray:
    return np.maximum(zipf_lengths(n, seed, cap=300), 1)  # no empty document: every occurrence is visible


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mix")
    return {
        "a": make_store(root / "a", _lengths(300, 1), seed=1),
        "b": make_store(root / "b", _lengths(200, 2), seed=2, with_loss=True),
        "c": make_store(root / "c", _lengths(150, 3), seed=3),
    }


def _pack(out: Path, *specs: str, flags: tuple[str, ...] = ()) -> str:
    code, stdout, err = cli("pack", *specs, "--size", str(N), "--output", str(out), "-q", *flags)
    assert code == 0, err
    return stdout


def _files(out: Path) -> dict[str, bytes]:
    d = out / "packed" / TOK
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and not p.name.startswith(".")}


def test_occurrence_counts_are_exact(stores: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    stdout = _pack(out, f"{stores['a']}:2", f"{stores['b']}:0.5", f"{stores['c']}:1.3")
    meta, counts = check_mixture_packs([stores["a"], stores["b"], stores["c"]], out / "packed" / TOK, "training", N)
    assert np.all(counts[0] == 2)
    assert set(np.unique(counts[1])) == {0, 1} and counts[1].sum() == round(0.5 * 200)
    assert set(np.unique(counts[2])) == {1, 2} and counts[2].sum() == 150 + math.floor(0.3 * 150 + 0.5)
    assert meta["format_version"] == 3 and meta["n_documents"] == sum(int(c.sum()) for c in counts)
    srcs = meta["source"]
    assert [s["weight"] for s in srcs] == [2.0, 0.5, 1.3]
    assert [s["documents"] for s in srcs] == [600, 100, 195]
    assert [s["doc_offset"] for s in srcs] == [0, 300, 500]
    assert sum(s["tokens"] for s in srcs) == meta["n_tokens"]
    assert abs(sum(s["share"] for s in srcs) - 1) < 1e-5
    assert f"{stores['b']} (weight 0.5): 100 documents" in stdout


def test_same_seed_same_bytes_other_seed_other_subset(stores: dict[str, Path], tmp_path: Path) -> None:
    specs = (f"{stores['a']}:1.5", f"{stores['b']}:0.25")
    _pack(tmp_path / "1", *specs, flags=("--workers", "1"))
    _pack(tmp_path / "2", *specs, flags=("--workers", "2"))
    assert _files(tmp_path / "1") == _files(tmp_path / "2")  # and for any --workers
    _pack(tmp_path / "v1", *specs, flags=("--workers", "1", "--validation", "0.2"))
    _pack(tmp_path / "v2", *specs, flags=("--workers", "2", "--validation", "0.2"))
    assert _files(tmp_path / "v1") == _files(tmp_path / "v2")
    _pack(tmp_path / "3", *specs, flags=("--seed", "7"))
    c1 = check_mixture_packs([stores["a"], stores["b"]], tmp_path / "1" / "packed" / TOK, "training", N)[1]
    c3 = check_mixture_packs([stores["a"], stores["b"]], tmp_path / "3" / "packed" / TOK, "training", N)[1]
    assert c1[0].sum() == c3[0].sum() == 450 and not np.array_equal(c1[0], c3[0])
    assert c1[1].sum() == c3[1].sum() == 50 and not np.array_equal(c1[1], c3[1])


def test_a_stores_subset_does_not_depend_on_its_position(stores: dict[str, Path], tmp_path: Path) -> None:
    _pack(tmp_path / "ab", f"{stores['a']}:1", f"{stores['b']}:0.5")
    _pack(tmp_path / "ba", f"{stores['b']}:0.5", f"{stores['a']}:1")
    ab = check_mixture_packs([stores["a"], stores["b"]], tmp_path / "ab" / "packed" / TOK, "training", N)[1]
    ba = check_mixture_packs([stores["b"], stores["a"]], tmp_path / "ba" / "packed" / TOK, "training", N)[1]
    np.testing.assert_array_equal(ab[1], ba[0])


def test_build_id_covers_the_mixture_spec(stores: dict[str, Path], tmp_path: Path) -> None:
    """A mixture vs a plain store: a different build (and format version). (This used a second entry of weight 1e-9
    for the same packs; a weight that gives a store no document is refused now, saying what it rounds to.)"""
    _pack(tmp_path / "plain", str(stores["a"]))
    _pack(tmp_path / "mix", f"{stores['a']}:1", f"{stores['a']}:1")
    plain = metadata_for(tmp_path / "plain" / "packed" / TOK, "training", N)
    mix = metadata_for(tmp_path / "mix" / "packed" / TOK, "training", N)
    assert plain["format_version"] == 2 and isinstance(plain["source"], dict)
    assert mix["format_version"] == 3 and len(mix["source"]) == 2 and mix["build"] != plain["build"]
    line = cli_error("pack", f"{stores['a']}:1", f"{stores['a']}:1e-9", "--size", str(N), "--output",
                     str(tmp_path / "z"), code=2)  # fmt: skip
    assert "mixture weight 1e-09" in line and "gives it 0 of its 300 documents" in line and "rounds to 0" in line
    assert not (tmp_path / "z").exists()


def test_a_single_store_pack_is_unchanged(stores: dict[str, Path], tmp_path: Path) -> None:
    """No weight, no validation: version 2, `source` an object, the same bytes as a library call."""
    _pack(tmp_path / "cli", str(stores["a"]))
    pack_store(PackConfig(stores["a"], N, tmp_path / "lib"))
    assert _files(tmp_path / "cli") == _files(tmp_path / "lib")
    meta = metadata_for(tmp_path / "cli" / "packed" / TOK, "training", N)
    assert set(meta["source"]) == {"path", "manifest_sha256"} and "mixture" not in meta


def test_store_without_loss_is_all_targets(stores: dict[str, Path], tmp_path: Path) -> None:
    _pack(tmp_path / "o", str(stores["a"]), str(stores["b"]))
    ps = open_pack_split(tmp_path / "o" / "packed" / TOK, "training", N)
    assert ps.loss is not None
    check_mixture_packs([stores["a"], stores["b"]], tmp_path / "o" / "packed" / TOK, "training", N)


def test_tokenizer_and_dtype_mismatch_name_both_stores(stores: dict[str, Path], tmp_path: Path) -> None:
    other = write_store(tmp_path / "other", [np.arange(2, 30)], tokenizer_sha="f" * 64)
    line = cli_error("pack", str(stores["a"]), str(other), "--size", str(N), "--output", str(tmp_path / "o"))
    assert "different tokenizers" in line and str(stores["a"]) in line and str(other) in line
    wide = write_store(tmp_path / "wide", [np.arange(2, 30)], vocab=70_000)
    line = cli_error("pack", str(stores["a"]), str(wide), "--size", str(N), "--output", str(tmp_path / "o"))
    assert "different dtypes" in line and "uint16" in line and "uint32" in line and str(wide) in line
    assert not (tmp_path / "o" / "packed" / TOK / f"{N}_metadata.jsonl").exists()


@pytest.mark.parametrize("weight", ["0", "-1", "0.0", "-0.5"])
def test_weight_not_above_zero_is_a_usage_error(stores: dict[str, Path], tmp_path: Path, weight: str) -> None:
    line = cli_error("pack", f"{stores['a']}:{weight}", "--size", str(N), "--output", str(tmp_path / "o"), code=2)
    assert "must be a finite number > 0" in line
    assert not (tmp_path / "o").exists()


def test_path_with_colons(tmp_path: Path) -> None:
    weird = tmp_path / "data:v2"
    assert parse_store_spec(f"{weird}:3") == (weird, 3.0)
    assert parse_store_spec("a:b") == (Path("a:b"), None)  # not a number: part of the path
    assert parse_store_spec("x:1e-2") == (Path("x"), 0.01)
    make_store(tmp_path / "s:1", _lengths(20, 4))
    assert parse_store_spec(str(tmp_path / "s:1")) == (tmp_path / "s:1", None)  # an existing directory wins
    assert parse_store_spec(f"{tmp_path / 's:1'}:2") == (tmp_path / "s:1", 2.0)
    _pack(tmp_path / "o", str(tmp_path / "s:1"), f"{tmp_path / 's:1'}:0.5")
    meta, counts = check_mixture_packs([tmp_path / "s:1"] * 2, tmp_path / "o" / "packed" / TOK, "training", N)
    assert counts[0].sum() == 20 and counts[1].sum() == 10


def test_verify_stats_and_export_report_every_source(stores: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o"
    _pack(out, f"{stores['a']}:2", f"{stores['b']}:0.5")
    code, stdout, err = cli("verify", str(out), "--source", str(stores["b"]), "--source", str(stores["a"]))
    assert code == 0 and str(stores["a"]) in stdout and str(stores["b"]) in stdout, err
    line = cli_error("verify", str(out), "--source", str(stores["a"]))
    assert "not given" in line and str(stores["b"]) in line
    line = cli_error("verify", str(out), "--source", str(stores["a"]), "--source", str(stores["b"]), "--source", str(stores["c"]))
    assert "another token store" in line and str(stores["c"]) in line
    code, stdout, _ = cli("stats", str(out))
    assert code == 0 and f"source {stores['a']} (weight 2): 600 documents" in stdout and "share" in stdout
    code, stdout, _ = cli("stats", str(out), "--json")
    got = json.loads(stdout)["sources"]
    assert [s["documents"] for s in got] == [600, 100]
    code, _, err = cli("export", str(out), "--to", "trl", "--output", str(tmp_path / "trl"))
    assert code == 0, err


def test_verify_catches_a_missing_repeat(stores: dict[str, Path], tmp_path: Path) -> None:
    """A mixture whose metadata claims weight 2 for packs of weight 1 fails verify --source (occurrences)."""
    out = tmp_path / "o"
    _pack(out, f"{stores['a']}:2", f"{stores['c']}:1")
    d = out / "packed" / TOK
    path = d / f"{N}_metadata.jsonl"
    meta = json.loads(path.read_text())
    meta["source"][1]["weight"] = 2.0  # the packs hold store c once
    path.write_text(json.dumps(meta) + "\n")
    line = cli_error("verify", str(out), "--source", str(stores["a"]), "--source", str(stores["c"]))
    assert "expected 2" in line or "n_documents" in line


def test_run_config_takes_a_mixture(stores: dict[str, Path], tmp_path: Path) -> None:
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(
        f"pack:\n  tokens_dir: ['{stores['a']}:2', {{path: '{stores['b']}', weight: 0.5}}]\n"
        f"  size: {N}\n  output: out\n  validation: 0.1\nstats: {{}}\nverify: {{}}\n"
    )
    code, stdout, err = cli("run", str(cfg))
    assert code == 0, err
    assert "round-trips" in stdout and "validation_128" in stdout
    meta = metadata_for(tmp_path / "out" / "packed" / TOK, "training", N)
    assert [s["weight"] for s in meta["source"]] == [2.0, 0.5]
    cfg.write_text(f"pack:\n  tokens_dir: ['{stores['a']}:0']\n  size: {N}\n  output: out\n")
    assert "must be a finite number > 0" in cli_error("run", str(cfg), code=2)  # as `pack STORE:0` does


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    weights=st.lists(st.floats(0.05, 3.0, allow_nan=False), min_size=1, max_size=3),
    algorithm=st.sampled_from(["ffd", "bfd", "mffd", "ffs", "concat"]),
    pad_multiple=st.sampled_from([1, 8]),
    seed=st.integers(0, 5),
)
def test_property_mixture_invariants(
    stores: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, weights: list[float], algorithm: str,
    pad_multiple: int, seed: int,
) -> None:
    names = ["a", "b", "c"][: len(weights)]
    out = tmp_path_factory.mktemp("prop")
    cfg = PackConfig(tuple(stores[n] for n in names), N, out, weights=tuple(weights), seed=seed,
                     algorithm=algorithm, pad_multiple=pad_multiple, workers=1)  # type: ignore[arg-type]
    pack_store(cfg)
    meta, counts = check_mixture_packs([stores[n] for n in names], out / "packed" / TOK, "training", N)
    for c, w in zip(counts, weights, strict=True):
        k, f = math.floor(w), w - math.floor(w)
        assert set(np.unique(c)) <= {k, k + 1}
        assert int(c.sum()) == k * c.size + math.floor(f * c.size + 0.5)


def test_weight_one_is_the_plain_pack(stores: dict[str, Path], tmp_path: Path) -> None:
    """`B:1` is no mixture: version 2, the plain checker accepts it, the bytes of `B`."""
    flags = ("--pad-multiple", "8", "--algorithm", "ffs")
    _pack(tmp_path / "w", f"{stores['b']}:1.0", flags=flags)
    _pack(tmp_path / "p", str(stores["b"]), flags=flags)
    meta = check_packs(stores["b"], tmp_path / "w" / "packed" / TOK, "training", N)
    assert meta["format_version"] == 2 and _files(tmp_path / "w") == _files(tmp_path / "p")


@pytest.mark.parametrize(("weight", "n", "extra"), [(0.15, 10, 2), (1.15, 10, 2), (2.15, 10, 2), (0.25, 10, 3),
                                                    (0.05, 10, 1), (1.0, 10, 0), (0.999, 10, 10), (0.5, 3, 2)])
def test_fractional_part_rounds_halves_up_whatever_the_integer_part(weight: float, n: int, extra: int) -> None:
    """round(f·n) with halves up, on the weight as written: float `1.15 - 1` is 0.1499..., which gave 1 here."""
    from packtool.core.mixture import fractional_count, repeat_documents

    assert fractional_count(weight, n) == extra
    counts = np.bincount(repeat_documents(np.arange(n), weight, seed=0, store_key="ab" * 32), minlength=n)
    assert sorted(counts.tolist()) == [int(weight)] * (n - extra) + [int(weight) + 1] * extra


# ---- weights out of their domain: usage errors naming the weight (and the YAML line), before any work ----


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf", "Infinity", "1e400", "abc", "0x10"])
def test_a_weight_that_is_no_finite_number_is_named(stores: dict[str, Path], tmp_path: Path, weight: str) -> None:
    """`A:nan`, `A:inf`: was 'token store A:inf does not exist' (exit 1); the weight is the problem (exit 2)."""
    line = cli_error("pack", f"{stores['a']}:{weight}", "--size", str(N), "--output", str(tmp_path / "o"), code=2)
    assert "mixture weight" in line and str(stores["a"]) in line and "does not exist" not in line
    assert "is not a number" in line if weight in ("abc", "0x10") else "must be a finite number > 0" in line
    assert not (tmp_path / "o").exists()
    # a colon in a path that does not exist is still a missing store, not a weight
    assert "does not exist" in cli_error("pack", str(tmp_path / "no:pe"), "--size", str(N), "--output", str(tmp_path / "o"))


def test_a_weight_too_large_for_memory_is_refused_before_allocating(
    stores: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pack A:1e12` was a MemoryError traceback in repeat_documents (A:1e7 reached ~10 GB RSS first)."""
    line = cli_error("pack", f"{stores['a']}:1e12", str(stores["b"]), "--size", str(N), "--output", str(tmp_path / "o"),
                     code=2)  # fmt: skip
    assert "300,000,000,000,200 document occurrences" in line and "GiB" in line and "lower its weight" in line
    assert f"{stores['a']}:1e+12 alone repeats 300 documents into 300,000,000,000,000" in line
    assert not (tmp_path / "o").exists()
    from packtool.stages.pack import mixture

    monkeypatch.setattr(mixture, "physical_memory", lambda: 300 * 1000 * mixture.BYTES_PER_OCCURRENCE - 1)
    assert "300,000 document occurrences" in cli_error(
        "pack", f"{stores['a']}:1000", "--size", str(N), "--output", str(tmp_path / "o"), code=2
    )
    _pack(tmp_path / "o", f"{stores['a']}:999.5")  # 299,850 occurrences fit


def test_run_config_weights_out_of_domain_name_the_line(stores: dict[str, Path], tmp_path: Path) -> None:
    """YAML `weight: .inf` was 'token store …:inf does not exist' (exit 1): exit 2 naming the weight and file:line."""
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(f"pack:\n  size: {N}\n  tokens_dir: [{{path: '{stores['a']}', weight: .inf}}]\n  output: out\n")
    line = cli_error("run", str(cfg), code=2)
    assert f"pack.tokens_dir, {cfg}:3" in line and "mixture weight inf" in line and "does not exist" not in line
    cfg.write_text(f"pack:\n  size: {N}\n  tokens_dir: ['{stores['a']}:nan']\n  output: out\n")
    assert f"{cfg}:3" in (line := cli_error("run", str(cfg), code=2)) and "mixture weight nan" in line
    cfg.write_text(f"pack:\n  size: {N}\n  output: out\n  tokens_dir: ['{stores['a']}', '{stores['b']}']\n"
                   "  weights: [1, .inf]\n")  # fmt: skip
    assert f"pack.weights, {cfg}:5" in (line := cli_error("run", str(cfg), code=2)) and "inf" in line
    # one weight per store: a `weights:` list of another length contradicts tokens_dir (it exited 1)
    cfg.write_text(f"pack:\n  size: {N}\n  output: out\n  tokens_dir: ['{stores['a']}', '{stores['b']}']\n  weights: [1]\n")
    assert "1 weights for 2 token stores, give one weight per store" in cli_error("run", str(cfg), code=2)
    # a block list: the weight's own line, not the line of `tokens_dir:` (it said :2 for a weight on :5)
    cfg.write_text(f"pack:\n  tokens_dir:\n    - path: '{stores['a']}'\n      weight: 1\n    - path: '{stores['b']}'\n"
                   f"      weight: .inf\n  size: {N}\n  output: out\n")  # fmt: skip
    line = cli_error("run", str(cfg), code=2)
    assert f"pack.tokens_dir, {cfg}:6: mixture weight inf" in line, line
    cfg.write_text(f"pack:\n  tokens_dir:\n    - path: '{stores['a']}'\n      weight: lots\n  size: {N}\n  output: out\n")
    line = cli_error("run", str(cfg), code=2)  # a usage error, as every config error is (it exited 1)
    assert f"pack.tokens_dir, {cfg}:4: weight 'lots'" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("order", ["inline first", "weights first"])
def test_run_config_weights_given_twice_names_the_conflict(stores: dict[str, Path], tmp_path: Path, order: str) -> None:
    """`tokens_dir: [A:3, B]` plus `weights:` said "key 'weights' given twice" (or dropped one silently)."""
    mix = f"  tokens_dir: ['{stores['a']}:3', '{stores['b']}']\n"
    weights = "  weights: [1, 2]\n"
    body = mix + weights if order == "inline first" else weights + mix
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(f"pack:\n  size: {N}\n  output: out\n{body}")
    line = cli_error("run", str(cfg), code=2)
    at_mix, at_weights = (4, 5) if order == "inline first" else (5, 4)
    assert f"pack.tokens_dir gives weights inline (STORE:WEIGHT or {{path, weight}}), {cfg}:{at_mix}" in line
    assert f"pack.weights gives them again, {cfg}:{at_weights}" in line and "given twice" not in line
    cfg.write_text(f"pack:\n  size: {N}\n  output: out\n  tokens_dir: ['{stores['a']}', '{stores['b']}']\n{weights}")
    code, _, err = cli("run", str(cfg), "-q")  # weights only in `weights:`: fine
    assert code == 0, err
