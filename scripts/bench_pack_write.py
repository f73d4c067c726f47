"""Pack-writing throughput and planning cost, as ratios against a raw memcpy measured in the same run.

    python scripts/bench_pack_write.py [--gb 1.0] [--docs 20000000] [--ray]

1. Builds a token store of ~--gb GB (uint16 random ids, lognormal(6, 1) document lengths) with
   TokenStoreWriter, then writes its packs (N = 4096, ffd) with the block writer:
   thread pool with 1 and 2 workers, a 2-process pool over the same PackBlockTasks, the numpy
   fancy-index gather the writer used before, a two-store mixture (the store twice at weight 0.5:
   the mixture writer's gap fill + per-store copies), `--validation 0.01` (both splits; total s
   includes hashing every document),
   and (--ray) Ray with 2 workers. Baseline: a raw
   copy of the same number of bytes from tokens.bin into a fresh .npy memmap (page cache, no
   gather). Every run is a fresh subprocess, so peak RSS (ru_maxrss) is that run's own; it
   counts the touched pages of the memory-mapped files, shared with the page cache.
2. `build_segments` + `pack_lengths` + `plan_layout` on --docs synthetic documents: seconds and
   peak RSS per document (what `pack` holds in memory besides the memory maps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SIZE = 4096


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_store(path: Path, gb: float) -> int:
    from packtool.formats.token_store import TokenStoreWriter

    rng = np.random.default_rng(0)
    target = int(gb * 1e9 / 2)  # uint16 tokens
    lengths = np.maximum(1, rng.lognormal(6, 1, size=int(target / 650 * 1.1)).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), target)) + 1]
    path.mkdir(parents=True)
    writer = TokenStoreWriter(path, np.dtype("uint16"))
    step = 1 << 16
    for i in range(0, lengths.size, step):
        part = lengths[i:i + step]
        writer.append(rng.integers(4, 60_000, size=int(part.sum()), dtype=np.uint16), part)
    writer.finish({"packtool_version": "bench", "tokenizer": {"name": "bench", "sha256": "0" * 64, "vocab_size": 60_000,
                                                              "bos_id": None, "eos_id": 0, "pad_id": 1}})
    return int(lengths.sum())


def child_pack(store: str, out: str, mode: str, workers: int) -> dict[str, float]:
    """One pack run; returns write-phase seconds, output bytes and peak RSS."""
    from packtool import PackConfig, pack_store
    from packtool.stages.pack import blocks, stage

    timing: dict[str, float] = {}
    original = stage._write_matrices  # the write phase alone is timed: swap in an instrumented one

    def timed(layout, st, w, config, pad_id, progress):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        if mode == "numpy":  # the previous writer: per-token int64 indices + fancy-index gather
            rows = max(1, blocks.BLOCK_TOKENS // config.size)
            tokens = np.asarray(st.first.tokens)  # a StoreSet of one store
            from packtool.core.packing.segments import expand_runs
            for p0 in range(0, layout.n_packs, rows):
                p1 = min(layout.n_packs, p0 + rows)
                s0, s1 = int(layout.pack_offsets[p0]), int(layout.pack_offsets[p1])
                block = np.full((p1 - p0) * config.size, pad_id, w.tokens.dtype)
                si, di = expand_runs(layout.real[s0:s1], layout.src[s0:s1], layout.dst[s0:s1] - p0 * config.size)
                block[di] = tokens[si]
                w.tokens[p0:p1] = block.reshape(p1 - p0, config.size)
        elif mode == "process":
            from concurrent.futures import ProcessPoolExecutor

            tasks = blocks.block_tasks(layout, st, w, config.size, pad_id)
            with ProcessPoolExecutor(workers) as pool:
                list(pool.map(blocks.PackBlockTask.run, tasks, chunksize=1))
        else:
            original(layout, st, w, config, pad_id, progress)
        timing["write_s"] = timing.get("write_s", 0.0) + time.perf_counter() - t0  # summed over splits
        timing["bytes"] = timing.get("bytes", 0.0) + float(w.tokens.nbytes)

    stage._write_matrices = timed  # type: ignore[assignment]
    executor = "ray" if mode == "ray" else "local"
    config = PackConfig(Path(store), SIZE, Path(out), workers=workers, executor=executor)
    if mode == "mixture":  # the same store twice at weight 0.5: a two-store mixture of the same size
        config = PackConfig((Path(store), Path(store)), SIZE, Path(out), workers=workers, weights=(0.5, 0.5))
    elif mode == "validation":  # + the content hash of every document, two splits
        config = PackConfig(Path(store), SIZE, Path(out), workers=workers, validation=0.01)
    t0 = time.perf_counter()
    pack_store(config)
    timing["total_s"] = time.perf_counter() - t0
    timing["rss_mb"] = rss_mb()
    return timing


def child_memcpy(store: str, out: str, n_bytes: int) -> dict[str, float]:
    from packtool.formats.token_store import open_token_store

    tokens = open_token_store(store).tokens
    n = min(n_bytes // 2, tokens.size)
    dst = np.lib.format.open_memmap(Path(out) / "copy.npy", mode="w+", dtype=np.uint16, shape=(n,))
    t0 = time.perf_counter()
    step = 1 << 22
    for i in range(0, n, step):
        dst[i:i + step] = tokens[i:i + step]
    # no flush: the writer's blocks do not msync either (commit fsyncs after the timed phase)
    return {"write_s": time.perf_counter() - t0, "bytes": float(n * 2), "rss_mb": rss_mb()}


def child_plan(n_docs: int) -> dict[str, float]:
    from packtool import PackConfig
    from packtool.core.packing import pack_lengths
    from packtool.core.packing.segments import build_segments
    from packtool.stages.pack.layout import plan_layout

    pack_lengths(np.array([5, 6, 7]), 16)  # compile outside the timings
    plan_layout(build_segments(np.zeros(2, np.int64), np.array([3, 4]), SIZE), PackConfig(Path("."), SIZE, Path("."), workers=1))
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6, 1, size=n_docs).astype(np.int64), 40_000)
    starts = np.cumsum(lengths) - lengths
    base = rss_mb()
    t0 = time.perf_counter()
    seg = build_segments(starts, lengths, SIZE)
    t1 = time.perf_counter()
    offsets, _ = pack_lengths(seg.lengths, SIZE, "ffd")
    t2 = time.perf_counter()
    del offsets
    layout = plan_layout(seg, PackConfig(Path("."), SIZE, Path("."), workers=1))
    t3 = time.perf_counter()
    peak = rss_mb()
    return {"docs": n_docs, "segments": len(seg), "packs": layout.n_packs, "segments_s": t1 - t0, "pack_lengths_s": t2 - t1,
            "plan_layout_s": t3 - t2, "input_mb": base, "peak_mb": peak, "bytes_per_doc": (peak - base) * 2**20 / n_docs,
            "total_bytes_per_doc": peak * 2**20 / n_docs}


def child_kernel() -> dict[str, float]:
    """The copy kernels alone, in memory: one store vs the same tokens as two stores (best of 3 each)."""
    from packtool.stages.pack.blocks import _readonly, gather_mixture, gather_segments

    rng = np.random.default_rng(0)
    tok = _readonly(rng.integers(0, 60_000, size=100_000_000).astype(np.uint16))
    lengths = np.maximum(1, rng.lognormal(6, 1, size=200_000).astype(np.int64))
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tok.size - 5000))]
    starts = np.cumsum(lengths) - lengths
    half = int(starts[starts.size // 2])  # the second "store" starts at a document
    perm = rng.permutation(lengths.size)
    real, src = lengths[perm], starts[perm]
    dst = np.cumsum(real) - real
    out = np.empty(int(real.sum()), np.uint16)
    which = (src >= half).astype(np.int64)
    local = src - which * half
    sources, has = (_readonly(tok[:half]), _readonly(tok[half:])), np.ones(2, bool)
    gather_segments(tok, src[:5], real[:5], dst[:5], out, 1)  # compile outside the timings
    gather_mixture(sources, has, which[:5], local[:5], real[:5], dst[:5], out, 1)
    single, mixed = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        gather_segments(tok, src, real, dst, out, 1)
        t1 = time.perf_counter()
        gather_mixture(sources, has, which, local, real, dst, out, 1)
        single.append(t1 - t0)
        mixed.append(time.perf_counter() - t1)
    return {"tokens": float(out.size), "single_s": min(single), "mixture_s": min(mixed)}


def run_child(*args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="token store size in GB (uint16)")
    ap.add_argument("--docs", type=int, default=20_000_000, help="documents for the planning benchmark (docs/SCALE.md: 100M)")
    ap.add_argument("--ray", action="store_true", help="also time --executor ray with 2 workers")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "pack":
            res = child_pack(rest[0], rest[1], rest[2], int(rest[3]))
        elif kind == "memcpy":
            res = child_memcpy(rest[0], rest[1], int(rest[2]))
        elif kind == "kernel":
            res = child_kernel()
        else:
            res = child_plan(int(rest[0]))
        print(json.dumps(res))
        return

    tmp = Path(tempfile.mkdtemp(prefix="bench_pack_write_"))
    try:
        t0 = time.perf_counter()
        n_tokens = make_store(tmp / "tokens", a.gb)
        print(f"token store: {n_tokens / 1e6:.0f} M tokens, {n_tokens * 2 / 1e9:.2f} GB uint16 "
              f"(built in {time.perf_counter() - t0:.0f} s); packs of N={SIZE}, ffd, {os.cpu_count()} cores")
        runs = [("threads, 1 worker", "threads", 1), ("threads, 2 workers", "threads", 2),
                ("process pool, 2 workers", "process", 2), ("numpy fancy-index (old writer)", "numpy", 1),
                ("mixture 2 x 0.5, 2 workers", "mixture", 2), ("--validation 0.01, 2 workers", "validation", 2)]
        if a.ray:
            runs.append(("ray, 2 workers", "ray", 2))
        results = {}
        for label, mode, workers in runs:
            out = tmp / f"out_{mode}_{workers}"
            results[label] = run_child("pack", str(tmp / "tokens"), str(out), mode, str(workers))
            shutil.rmtree(out)
        n_bytes = int(results["threads, 1 worker"]["bytes"])
        (tmp / "mc").mkdir()
        base = run_child("memcpy", str(tmp / "tokens"), str(tmp / "mc"), str(n_bytes))
        shutil.rmtree(tmp / "mc")
        base_gbs = base["bytes"] / base["write_s"] / 1e9
        print(f"{'writer':<34}{'write s':>9}{'GB/s':>8}{'x memcpy':>10}{'total s':>9}{'peak RSS MB':>13}")
        print(f"{'raw memcpy tokens.bin -> .npy':<34}{base['write_s']:>9.2f}{base_gbs:>8.2f}{1.0:>10.2f}{'':>9}{base['rss_mb']:>13.0f}")
        for label, r in results.items():
            gbs = r["bytes"] / r["write_s"] / 1e9
            print(f"{label:<34}{r['write_s']:>9.2f}{gbs:>8.2f}{gbs / base_gbs:>10.2f}{r['total_s']:>9.2f}{r['rss_mb']:>13.0f}")
        print(f"output: {n_bytes / 1e9:.2f} GB of packs")
        k = run_child("kernel")
        print(f"copy kernel, {k['tokens'] / 1e6:.0f} M tokens in memory: one store {k['single_s']:.3f} s, "
              f"the same as a 2-store mixture {k['mixture_s']:.3f} s (x{k['mixture_s'] / k['single_s']:.2f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    plan = run_child("plan", str(a.docs))
    print(f"planning {plan['docs'] / 1e6:.0f} M docs -> {plan['segments'] / 1e6:.1f} M segments, {plan['packs'] / 1e6:.2f} M packs: "
          f"build_segments {plan['segments_s']:.1f} s, pack_lengths(ffd) {plan['pack_lengths_s']:.1f} s, "
          f"plan_layout (its own pack_lengths, default bfd, + placement) {plan['plan_layout_s']:.1f} s; peak RSS {plan['peak_mb'] / 1024:.1f} GB "
          f"({plan['bytes_per_doc']:.0f} B/doc over the lengths+starts input, {plan['total_bytes_per_doc']:.0f} B/doc in all)")


if __name__ == "__main__":
    main()
