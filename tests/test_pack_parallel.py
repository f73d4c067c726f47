"""Parallel pack writing: fixed blocks of rows as pure tasks give identical bytes for any
`--workers`, for the thread pool and for Ray, with loss masks, uint32 ids, padding and splits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support import check_packs, cli, make_store, zipf_lengths

from packtool import PackConfig, pack_store
from packtool.core.packing.segments import build_segments, expand_runs
from packtool.errors import ConfigError
from packtool.exec import make_executor
from packtool.formats.pack_store import pack_dir
from packtool.formats.token_store import open_token_store
from packtool.stages.pack import blocks as writer
from packtool.stages.pack.blocks import gather_segments
from packtool.stages.pack.layout import plan_layout

SIZE = 256


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 3 rows, so that even a small store is many tasks (and a ragged last block)."""
    monkeypatch.setattr(writer, "BLOCK_TOKENS", 3 * SIZE)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lengths = zipf_lengths(3000, seed=4, cap=700)  # Zipf lengths, empty docs, some longer than SIZE
    return make_store(tmp_path_factory.mktemp("par") / "tokens", lengths, vocab=70_000, with_loss=True, seed=4)


def files_of(root: Path, tokenizer: str = "org/tiny-tok") -> dict[str, bytes]:
    d = pack_dir(root, tokenizer)
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".npy"}


def test_gather_kernel_matches_fancy_index_reference() -> None:
    rng = np.random.default_rng(1)
    source = rng.integers(0, 2**32 - 1, size=10_000, dtype=np.uint32)
    real = rng.integers(0, 50, size=100).astype(np.int64)
    gaps = rng.integers(0, 5, size=100).astype(np.int64)
    dst = np.cumsum(real + gaps) - real - gaps + gaps  # each segment starts after a gap
    src = rng.integers(0, source.size - 50, size=100).astype(np.int64)
    out = np.zeros(int(dst[-1] + real[-1]) + 7, np.uint32)
    gather_segments(source, src, real, dst, out, 4_000_000_000)
    expect = np.full_like(out, 4_000_000_000)
    s_idx, d_idx = expand_runs(real, src, dst)
    expect[d_idx] = source[s_idx]
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("extra", [[], ["--pad-multiple", "8", "--algorithm", "bfd"], ["--max-docs-per-pack", "5", "--no-shuffle"]])
def test_bytes_identical_for_any_workers(tmp_path: Path, store: Path, small_blocks: None, extra: list[str]) -> None:
    outs = {}
    for workers in (1, 2, 5):
        root = tmp_path / f"w{workers}"
        code, _, msg = cli("pack", str(store), "--size", str(SIZE), "--output", str(root), "-q", "--workers", str(workers), *extra)
        assert code == 0, msg
        outs[workers] = files_of(root)
    assert outs[1] == outs[2] == outs[5]
    assert any(name.endswith(".loss.npy") for name in outs[1])
    meta = check_packs(store, pack_dir(tmp_path / "w2", "org/tiny-tok"), "training", SIZE)
    assert meta["n_packs"] > 30  # many blocks of 3 rows


def test_block_tasks_cover_every_row_once(tmp_path: Path, store: Path, small_blocks: None) -> None:
    config = PackConfig(store, SIZE, tmp_path, workers=2)
    result = pack_store(config)
    ts = open_token_store(store)
    layout = plan_layout(build_segments(ts.starts, ts.lengths, SIZE), config)

    class FakeWriter:  # block_tasks only needs the temp file names
        tokens = np.memmap(tmp_path / "t.npy", dtype=np.uint8, mode="w+", shape=(1,))
        loss = None

    tasks = writer.block_tasks(layout, ts, FakeWriter(), SIZE, 0)  # type: ignore[arg-type]
    rows = np.concatenate([np.arange(t.p0, t.p1) for t in tasks])
    np.testing.assert_array_equal(rows, np.arange(result.metadata["n_packs"]))
    assert {t.p1 - t.p0 for t in tasks[:-1]} == {3}
    assert sum(t.src.size for t in tasks) == result.metadata["n_segments"]


def test_progress_reaches_every_pack(tmp_path: Path, store: Path, small_blocks: None) -> None:
    seen: list[tuple[int, int]] = []
    result = pack_store(PackConfig(store, SIZE, tmp_path, workers=2), lambda d, t: seen.append((d, t)))
    n = result.metadata["n_packs"]
    assert seen[-1] == (n, n) and all(t == n for _, t in seen) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_failing_block_aborts_and_leaves_no_files(tmp_path: Path, store: Path, small_blocks: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real_run = writer.PackBlockTask.run

    def flaky(self: writer.PackBlockTask) -> tuple[int, int]:
        calls["n"] += 1
        if self.p0 == 9:
            raise ConfigError("boom in block 9")
        return real_run(self)

    monkeypatch.setattr(writer.PackBlockTask, "run", flaky)
    with pytest.raises(ConfigError, match="boom"):
        pack_store(PackConfig(store, SIZE, tmp_path, workers=2))
    d = pack_dir(tmp_path, "org/tiny-tok")
    assert not d.exists()  # temps removed, nothing under final names, and the directories this run made gone


def test_executor_errors_are_usage_errors(tmp_path: Path, store: Path) -> None:
    code, _, msg = cli("pack", str(store), "--size", "64", "--output", str(tmp_path), "-q", "--ray-address", "auto")
    assert code == 2 and "--ray-address needs --executor ray" in msg and msg.count("\n") == 1
    code, _, msg = cli("pack", str(store), "--size", "64", "--output", str(tmp_path), "-q", "--executor", "slurm")
    assert code == 2 and "'slurm' is not one of" in msg and "Traceback" not in msg  # a usage error
    with pytest.raises(ConfigError, match="--workers must be an integer >= 1"):
        pack_store(PackConfig(store, 64, tmp_path, workers=0))
    assert make_executor("local", 1)([]) is not None


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
def test_ray_executor_gives_local_bytes(tmp_path: Path, store: Path, local_ray: None,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "BLOCK_TOKENS", 40 * SIZE)  # ~10 Ray tasks: enough blocks, little overhead
    args = ("pack", str(store), "--size", str(SIZE), "-q", "--pad-multiple", "4")
    assert cli(*args, "--output", str(tmp_path / "local"), "--workers", "1")[0] == 0
    code, _, msg = cli(*args, "--output", str(tmp_path / "ray"), "--executor", "ray", "--workers", "2")
    assert code == 0, msg
    assert files_of(tmp_path / "local") == files_of(tmp_path / "ray")
    check_packs(store, pack_dir(tmp_path / "ray", "org/tiny-tok"), "training", SIZE)
