"""Benchmark: PackedDataset + PackedCollator throughput vs a raw memmap read of the same rows.

Builds a ~200 MB pack store of random uint16 tokens through the format module (concat-style
packs: Zipf-like documents cut at pack boundaries), warms the page cache, then times, in the
same run and over the same shuffled batches:
  raw bytes    `tokens[idx]`: the pack rows copied out of the memmap (the floor for any loader);
  raw + int64  the same plus `torch.from_numpy(x.astype(int64))` (what a naive unpacked loader
               must do at least to hand `input_ids` to an embedding);
  loader w=0/2 DataLoader(PackedDataset, PackedCollator(flatten=True)) with 0 and 2 workers,
               building input_ids, labels, position_ids and validated cu_seqlens.
Prints batches/s, tokens/s and the ratio of each to the raw read time. No assertions.

    python scripts/bench_loader.py [--tokens 100000000] [--size 4096] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from packtool.formats.pack_store import FORMAT_VERSION, PackSplitWriter
from packtool.loader import PackedCollator, PackedDataset, PackedSampler


def build_store(directory: Path, n_tokens: int, size: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n_packs = n_tokens // size
    total = n_packs * size
    doc_lens = np.minimum(rng.zipf(1.3, size=total // 50 + 1000), 700) * 30  # clip first: zipf can overflow
    ends = np.cumsum(doc_lens)
    ends = ends[ends < total]
    bounds = np.union1d(np.concatenate([ends, np.arange(size, total + 1, size)]), [0])
    seg_lens = np.diff(bounds)
    pack_offsets = np.searchsorted(bounds, np.arange(0, total + 1, size))
    writer = PackSplitWriter(directory, "training", size, np.dtype("<u2"), n_packs, with_loss=False)
    block = 4096
    for a in range(0, n_packs, block):
        b = min(n_packs, a + block)
        writer.tokens[a:b] = rng.integers(0, 50_000, size=(b - a, size), dtype=np.uint16)
    writer.write_companion("pack_offsets", pack_offsets)
    writer.write_companion("seg_lens", seg_lens)
    writer.write_companion("seg_pad", np.zeros_like(seg_lens))
    writer.write_companion("seg_doc", np.searchsorted(ends, bounds[:-1], side="right"))
    writer.write_companion("seg_src", bounds[:-1])
    writer.commit({"split": "training", "pack_size": size, "dtype": "uint16", "pad_id": 0,
                   "format_version": FORMAT_VERSION, "n_packs": n_packs, "n_segments": int(seg_lens.size)})


def batches_of(ds: PackedDataset, batch_size: int) -> list[np.ndarray]:
    order = PackedSampler(ds, num_replicas=1, rank=0, seed=1).indices()
    return [order[i:i + batch_size] for i in range(0, order.size - batch_size + 1, batch_size)]


def time_raw(ds: PackedDataset, batches: list[np.ndarray], to_int64: bool) -> float:
    tokens = ds._open().tokens
    t0 = time.perf_counter()
    for idx in batches:
        rows = tokens[idx]
        if to_int64:
            torch.from_numpy(rows.astype(np.int64))
    return time.perf_counter() - t0


def time_loader(ds: PackedDataset, batch_size: int, workers: int, n_batches: int) -> float:
    sampler = PackedSampler(ds, num_replicas=1, rank=0, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers,
                                         collate_fn=PackedCollator(flatten=True), prefetch_factor=8 if workers else None)
    it = iter(loader)
    next(it)  # worker start-up is not throughput
    t0 = time.perf_counter()
    seen = 1
    for _ in it:
        seen += 1
    elapsed = time.perf_counter() - t0
    assert seen == n_batches, (seen, n_batches)
    return elapsed * n_batches / (n_batches - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000_000, help="tokens in the store (uint16: 2 bytes each)")
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--dir", type=Path, default=None, help="where to build the store (default: a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = (args.dir or Path(tmp)) / "packed" / "bench"
        t0 = time.perf_counter()
        build_store(directory, args.tokens, args.size)
        ds = PackedDataset(directory)
        store = ds._open()
        mb = store.tokens.nbytes / 1e6
        print(f"store: {len(ds)} packs x {args.size} tokens ({mb:.0f} MB), {store.seg_lens.size} segments, built in {time.perf_counter() - t0:.1f}s")
        batches = batches_of(ds, args.batch_size)
        n_tok = len(batches) * args.batch_size * args.size
        time_raw(ds, batches, to_int64=False)  # warm the page cache: every run below reads from memory
        results = {"raw bytes": time_raw(ds, batches, to_int64=False), "raw + int64": time_raw(ds, batches, to_int64=True)}
        for workers in (0, 2):
            results[f"loader w={workers}"] = time_loader(ds, args.batch_size, workers, len(batches))
        results["raw bytes (again)"] = time_raw(ds, batches, to_int64=False)
        raw = min(results["raw bytes"], results["raw bytes (again)"])
        raw64 = results["raw + int64"]
        print(f"{len(batches)} batches of {args.batch_size} packs ({n_tok / 1e6:.0f}M tokens), shuffled order")
        print(f"{'':18} {'batches/s':>10} {'Mtokens/s':>10} {'x raw bytes':>12} {'x raw+int64':>12}")
        for name, sec in results.items():
            print(f"{name:18} {len(batches) / sec:10.0f} {n_tok / sec / 1e6:10.1f} {sec / raw:12.2f} {sec / raw64:12.2f}")


if __name__ == "__main__":
    main()
