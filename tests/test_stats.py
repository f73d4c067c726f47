"""`packtool stats` through the CLI: hand-checked waste ratios on a tiny store, consistency of every
strategy on a Zipf-length store (packers >= lower bound, naive >= sorted batches >= lower bound), pack
store fill, --json, --plot PNGs, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import cli, cli_error, write_random_store, zipf_texts

from packtool import StatsConfig, compute_stats
from packtool.core.packing import ALGORITHMS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NAIVE, RANDOM, SORTED, BOUND = "naive (pad each to N)", "random batches of B", "sorted batches of B", "lower bound"
DYNAMIC = "dynamic (padded)"


def stats_json(*args: str) -> dict:
    code, out, err = cli("stats", *args, "--json")
    assert code == 0, err
    return json.loads(out)



@pytest.fixture(scope="module")
def zipf_store(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> Path:
    d = tmp_path_factory.mktemp("stats")
    (d / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in zipf_texts(400, seed=9)))
    code, _, err = cli("tokenize", str(d / "in.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(d / "store"),
                       "--workers", "1", "-q")
    assert code == 0, err
    return d / "store"


def test_hand_checked_waste_on_a_tiny_store(tmp_path: Path) -> None:
    """Lengths [4096, 100, 100] at N = 4096: naive pads 3 rows; packing needs 2 rows (4096 | 100+100)."""
    store = write_random_store(tmp_path / "s", [4096, 100, 100])
    s = stats_json(str(store), "--size", "4096", "--batch-size", "8")
    total = 4296
    assert s["kind"] == "tokens" and s["n_tokens"] == total and s["n_documents"] == 3 and s["n_items"] == 3
    assert s["waste"][NAIVE] == pytest.approx(1 - total / (3 * 4096))
    assert s["waste"][RANDOM] == pytest.approx(1 - total / (3 * 4096))  # one batch of 3, padded to 4096
    assert s["rows"][BOUND] == 2 and s["waste"][BOUND] == pytest.approx(1 - total / (2 * 4096))
    for name in ALGORITHMS:
        assert s["rows"][f"pack {name}"] == 2
        assert s["waste"][f"pack {name}"] == pytest.approx(1 - total / 8192)
    assert s["lengths"]["max"] == 4096 and s["n_overlong"] == 0
    # dynamic, budget B*N = 32768: the greedy batch of 3 rows padded to 4096 (as the random batch) is cut
    # into [100, 100] | [4096], which saves 65% of it: no padding left
    assert s["waste"][DYNAMIC] == pytest.approx(0.0) and s["rows"][DYNAMIC] == 3
    # [100, 90, 80]: one batch of 3 rows of 100; the best cut ([80] | [90, 100]) would save only 7%
    close = stats_json(str(write_random_store(tmp_path / "t", [100, 90, 80])), "--size", "4096")["waste"]
    assert close[DYNAMIC] == pytest.approx(1 - 270 / 300)
    # B = 2, sorted: [100, 100] then [4096] -> no padding at all; dynamic (budget 8192) finds the same
    two = stats_json(str(store), "--size", "4096", "--batch-size", "2")["waste"]
    assert two[SORTED] == pytest.approx(0.0) and two[DYNAMIC] == pytest.approx(0.0)


def test_overlong_documents_count_as_fragments(tmp_path: Path) -> None:
    store = write_random_store(tmp_path / "s", [300, 0, 50, 100])
    s = stats_json(str(store), "--size", "128")
    assert s["n_overlong"] == 1 and s["n_empty_documents"] == 1
    assert s["n_items"] == 3 + 2  # 300 -> 128 + 128 + 44; the empty document is left out
    assert s["rows"][NAIVE] == 5 and s["rows"][BOUND] == -(-450 // 128)


def test_strategies_are_consistent_on_a_zipf_store(zipf_store: Path) -> None:
    for size in ("64", "256"):
        s = stats_json(str(zipf_store), "--size", size, "--batch-size", "4")
        n = int(size)
        assert s["rows"][BOUND] == -(-s["n_tokens"] // n)
        bound = s["waste"][BOUND]
        for name in ALGORITHMS:
            assert s["waste"][f"pack {name}"] >= bound - 1e-12
            assert s["rows"][f"pack {name}"] >= s["rows"][BOUND]
        assert s["waste"][NAIVE] >= s["waste"][SORTED] >= bound
        assert s["waste"][NAIVE] >= s["waste"][RANDOM]
        assert s["waste"]["pack ffd"] < s["waste"][SORTED]  # packing is the point
        assert 0 <= s["waste"][DYNAMIC] <= s["waste"][RANDOM] / 2  # sorting inside windows + a token budget
        assert set(s["lengths"]) == {"p50", "p90", "p99", "max"}
        assert s["lengths"]["p50"] <= s["lengths"]["p90"] <= s["lengths"]["p99"] <= s["lengths"]["max"]
    code, out, _ = cli("stats", str(zipf_store), "--size", "256")
    assert code == 0 and "lower bound" in out and "pack ffd" in out and DYNAMIC in out


def test_pack_store_stats_match_its_metadata(tmp_path: Path) -> None:
    store = write_random_store(tmp_path / "s", [4096, 100, 100])
    code, _, err = cli("pack", str(store), "--size", "4096", "--output", str(tmp_path / "out"), "--quiet")
    assert code == 0, err
    s = stats_json(str(tmp_path / "out"))
    assert s["kind"] == "packs" and s["n_packs"] == 2 and s["n_segments"] == 3 and s["lower_bound_packs"] == 2
    assert s["efficiency"] == pytest.approx(4296 / 8192) and s["pad_share"] == pytest.approx(1 - 4296 / 8192)
    assert s["docs_per_pack_mean"] == pytest.approx(1.5) and s["docs_per_pack_max"] == 2
    (pack_dir,) = (tmp_path / "out" / "packed").iterdir()  # the one tokenizer directory
    npy = pack_dir / "training_4096.npy"
    assert stats_json(str(npy))["n_packs"] == 2
    lib = compute_stats(StatsConfig(tmp_path / "out"))
    assert lib.to_dict() == s


def test_plot_writes_png(tmp_path: Path, zipf_store: Path) -> None:
    out = tmp_path / "plots" / "tokens.png"
    code, _, err = cli("stats", str(zipf_store), "--size", "128", "--plot", str(out))
    assert code == 0, err
    assert out.read_bytes()[:8] == PNG_SIGNATURE and out.stat().st_size > 1000
    code, _, err = cli("pack", str(zipf_store), "--size", "128", "--output", str(tmp_path / "packs"), "--quiet")
    assert code == 0, err
    png = tmp_path / "packs.png"
    code, _, err = cli("stats", str(tmp_path / "packs"), "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_bad_input_exits_1_with_one_line(tmp_path: Path, zipf_store: Path) -> None:
    assert "no token store or pack store" in cli_error("stats", str(tmp_path / "missing"))
    assert "--batch-size" in cli_error("stats", str(zipf_store), "--batch-size", "0", code=2)  # out of its domain
    for size in ("64", "128"):
        code, _, err = cli("pack", str(zipf_store), "--size", size, "--output", str(tmp_path / "two"), "--quiet")
        assert code == 0, err
    assert "pass --size" in cli_error("stats", str(tmp_path / "two"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    assert "manifest.json is not valid JSON" in cli_error("stats", str(tmp_path / "broken"))


def test_a_huge_batch_size_is_one_batch_not_an_allocation(zipf_store: Path) -> None:
    """`--batch-size 1e14` was an ArrayMemoryError traceback (B padded slots); 1e16 overflowed the compiled
    dynamic batcher's int64 budget. A batch size past the item count is one batch of every item."""
    n_items = stats_json(str(zipf_store), "--size", "128")["n_items"]
    one_batch = stats_json(str(zipf_store), "--size", "128", "--batch-size", str(n_items))
    for huge in ("100000000000000", "10000000000000000", str(10**30)):
        got = stats_json(str(zipf_store), "--size", "128", "--batch-size", huge)
        assert got["waste"] == one_batch["waste"] and got["rows"] == one_batch["rows"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 500), max_size=60), st.integers(1, 80), st.integers(1, 600))
def test_padded_batches_equal_the_padded_reference(lengths: list[int], batch: int, cap: int) -> None:
    """The O(n) batch padding equals padding every batch of B to its longest (the old, O(B)-memory form)."""
    from packtool.stages.stats.compute import _padded_batches

    arr = np.asarray(lengths, np.int64)
    want = (0, 0)
    if arr.size:
        rows = [arr[i : i + batch] for i in range(0, arr.size, batch)]
        want = (arr.size, sum(min(int(r.max()), cap) * r.size for r in rows))
    assert _padded_batches(arr, batch, cap) == want
