"""`packtool stats` through the CLI: JSON numbers consistent with each other, table, PNG, failures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from test_pack_store import cli, make_store, zipf_lengths


def test_token_store_stats_json_is_consistent(tmp_path: Path) -> None:
    lengths = zipf_lengths(1500, seed=2, cap=900)
    store = make_store(tmp_path / "tok", lengths)
    code, out = cli("stats", str(store), "--size", "256", "--batch-size", "16", "--json")
    assert code == 0, out
    s = json.loads(out)
    waste = s["waste"]
    assert s["n_documents"] == 1500 and s["n_tokens"] == int(lengths.sum())
    assert s["n_empty_documents"] == int(np.sum(lengths == 0)) and s["n_overlong"] == int(np.sum(lengths > 256))
    assert s["lengths"]["max"] == int(lengths.max()) and s["lengths"]["p50"] <= s["lengths"]["p90"] <= s["lengths"]["p99"]
    lb = waste["lower bound"]
    assert abs(lb - (1 - lengths.sum() / (np.ceil(lengths.sum() / 256) * 256))) < 1e-12
    for name in ("pack ffd", "pack bfd", "pack mffd", "pack ffs", "pack concat"):
        assert waste[name] >= lb - 1e-12, name
        assert s["rows"][name] >= s["rows"]["lower bound"]
    assert waste["naive (pad each to N)"] >= waste["sorted batches of B"]
    assert waste["random batches of B"] >= waste["sorted batches of B"]
    assert waste["naive (pad each to N)"] >= waste["pack ffd"]
    # naive waste is exactly 1 - total / (items * N), with over-long documents split into fragments
    items = np.concatenate([np.full(x // 256, 256), [x % 256]] if False else [np.minimum(256, lengths[lengths > 0])])
    n_items = int(np.sum(-(-lengths[lengths > 0] // 256)))
    assert s["n_items"] == n_items >= items.size
    assert abs(waste["naive (pad each to N)"] - (1 - lengths.sum() / (n_items * 256))) < 1e-12


def test_token_store_table_and_plot(tmp_path: Path) -> None:
    store = make_store(tmp_path / "tok", zipf_lengths(300, seed=4))
    png = tmp_path / "plots/waste.png"
    code, out = cli("stats", str(store), "--size", "64", "--plot", str(png))
    assert code == 0, out
    assert "pack ffd" in out and "lower bound" in out and "p99" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pack_store_stats(tmp_path: Path) -> None:
    lengths = zipf_lengths(600, seed=8)
    store = make_store(tmp_path / "tok", lengths)
    assert cli("pack", str(store), "--size", "128", "--output", str(tmp_path / "out"), "-q")[0] == 0
    code, out = cli("stats", str(tmp_path / "out"), "--json", "--plot", str(tmp_path / "p.png"))
    assert code == 0, out
    s = json.loads(out)
    assert s["kind"] == "packs" and s["size"] == 128 and s["n_tokens"] == int(lengths.sum())
    assert abs(s["efficiency"] + s["pad_share"] - 1) < 1e-12
    assert abs(s["efficiency"] - lengths.sum() / (s["n_packs"] * 128)) < 1e-12
    assert s["docs_per_pack_max"] >= s["docs_per_pack_mean"] >= 1
    assert s["overlong"] == {"policy": "split", "count": int(np.sum(lengths > 128))}
    assert (tmp_path / "p.png").stat().st_size > 1000
    code, out = cli("stats", str(tmp_path / "out/packed/org--tiny-tok/training_128.npy"))
    assert code == 0 and "efficiency" in out


def test_stats_failures_are_one_line(tmp_path: Path) -> None:
    code, out = cli("stats", str(tmp_path / "missing"))
    assert code == 1 and out.startswith("error: ") and out.count("\n") == 1
    store = make_store(tmp_path / "tok", np.array([3, 4]))
    code, out = cli("stats", str(store), "--batch-size", "0")
    assert code == 1 and "--batch-size" in out
    (store / "tokens.bin").write_bytes(b"\x00")
    code, out = cli("stats", str(store))
    assert code == 1 and "tokens.bin" in out and out.count("\n") == 1
