"""Benchmark: PackedDataset + PackedCollator throughput vs a raw memmap read of the same rows.

Builds a pack store of random uint16 tokens per pack size N through the format module
(concat-style packs: Zipf-like documents cut at pack boundaries, ~2 segments per pack), warms
the page cache, then times, in the same run and over the same shuffled batches, for each shape
B x N:
  raw bytes    `tokens[idx]`: the pack rows copied out of the memmap (the floor for any loader);
  raw + int64  the same plus `torch.from_numpy(x.astype(int64))` (what a naive unpacked loader
               must do at least to hand `input_ids` to an embedding);
  loader w=0   DataLoader(PackedDataset, PackedCollator(flatten=True)) in the main process,
               building input_ids, labels, position_ids (int64) and validated int32 cu_seqlens:
               once with the single-threaded kernel (`numba.set_num_threads(1)`) and once with the
               rows spread over --threads numba threads (the raw reads are single-threaded numpy);
  loader w=2   the same with 2 DataLoader workers (each builds its batches single-threaded).
Prints batches/s, tokens/s and the ratio of each time to the raw read times (best of
--repeat runs each: the machine may be shared). No assertions.

Then, on a CUDA GPU, DevicePrefetcher: the median step of a loop whose step is GPU matmuls calibrated to
--prefetch-ms and a `.item()` sync (as logging the loss does), fed by the w=0 loader of the first shape,
made slower by --prefetch-ms of sleep per batch (a slow file system) and as it is: `serial` copies each
batch with `.to("cuda")` in the step, `prefetched` gets it from DevicePrefetcher (copied ahead on a side
stream while the step runs). Printed as seconds and as a ratio to max(load, compute), the floor when
loading and computing overlap (serial sits near load + compute). On CPU the section says it is skipped.

    python scripts/bench_loader.py [--tokens 100000000] [--shapes 8x4096,32x4096,16x8192] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import torch

from packtool.formats.pack_store import FORMAT_VERSION
from packtool.formats.pack_writer import PackSplitWriter
from packtool.loader import DevicePrefetcher, PackedCollator, PackedDataset, PackedSampler


def build_store(directory: Path, n_tokens: int, size: int, seed: int = 0, unit: int = 30) -> None:
    """Concat-style packs of Zipf-like documents whose lengths are multiples of `unit` (random ids)."""
    rng = np.random.default_rng(seed)
    n_packs = n_tokens // size
    total = n_packs * size
    doc_lens = np.minimum(rng.zipf(1.3, size=total // 50 + 1000), 700) * unit  # clip first: zipf can overflow
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


def batches_of(ds: PackedDataset, batch_size: int, max_batches: int) -> list[np.ndarray]:
    order = PackedSampler(ds, num_replicas=1, rank=0, seed=1).indices()
    return [order[i:i + batch_size] for i in range(0, order.size - batch_size + 1, batch_size)][:max_batches]


def time_raw(ds: PackedDataset, batches: list[np.ndarray], to_int64: bool) -> float:
    tokens = ds._open().tokens
    t0 = time.perf_counter()
    for idx in batches:
        rows = tokens[idx]
        if to_int64:
            torch.from_numpy(rows.astype(np.int64))
    return time.perf_counter() - t0


def time_loader(ds: PackedDataset, batch_size: int, workers: int, n_batches: int) -> float:
    """Seconds for the first `n_batches` batches (same order as `batches_of`); worker start-up excluded."""
    sampler = PackedSampler(ds, num_replicas=1, rank=0, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=workers,
                                         collate_fn=PackedCollator(flatten=True), prefetch_factor=8 if workers else None)
    it = iter(loader)
    next(it)  # worker start-up is not throughput
    t0 = time.perf_counter()
    for _ in range(n_batches - 1):
        next(it)
    elapsed = time.perf_counter() - t0
    del it  # stops the workers
    return elapsed * n_batches / (n_batches - 1)


def with_threads(threads: int, run):  # type: ignore[no-untyped-def]
    def timed() -> float:
        numba.set_num_threads(threads)  # thread-local: applies to the w=0 loader (main thread)
        try:
            return run()
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    return timed


def bench_shape(ds: PackedDataset, batch_size: int, repeat: int, max_batches: int, threads: int) -> None:
    batches = batches_of(ds, batch_size, max_batches)
    n_tok = len(batches) * batch_size * ds.size
    time_raw(ds, batches, to_int64=False)  # warm the page cache: every run below reads from memory
    time_loader(ds, batch_size, 0, min(50, len(batches)))  # and the numba kernels (compiled or loaded from cache)
    runs = {"raw bytes": lambda: time_raw(ds, batches, False), "raw + int64": lambda: time_raw(ds, batches, True),
            "loader w=0 1t": with_threads(1, lambda: time_loader(ds, batch_size, 0, len(batches))),
            f"loader w=0 {threads}t": with_threads(threads, lambda: time_loader(ds, batch_size, 0, len(batches))),
            "loader w=2": lambda: time_loader(ds, batch_size, 2, len(batches))}
    results = {name: min(run() for _ in range(repeat)) for name, run in runs.items()}
    raw, raw64 = results["raw bytes"], results["raw + int64"]
    print(f"\nB={batch_size} x N={ds.size}: {len(batches)} batches ({n_tok / 1e6:.0f}M tokens), shuffled, best of {repeat}")
    print(f"{'':14} {'batches/s':>10} {'Mtokens/s':>10} {'x raw bytes':>12} {'x raw+int64':>12}")
    for name, sec in results.items():
        print(f"{name:14} {len(batches) / sec:10.0f} {n_tok / sec / 1e6:10.1f} {sec / raw:12.2f} {sec / raw64:12.2f}")


class _Delayed:
    """The batches of a loader, each `delay` seconds late (a slow file system)."""

    def __init__(self, loader, delay: float) -> None:  # type: ignore[no-untyped-def]
        self.loader, self.delay = loader, delay

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in self.loader:
            time.sleep(self.delay)
            yield batch


def _median_step(batches, x: torch.Tensor, k: int, copy: bool, steps: int) -> float:  # type: ignore[no-untyped-def]
    times, t = [], time.perf_counter()
    for i, batch in enumerate(batches):
        ids = batch["input_ids"].to("cuda", non_blocking=False) if copy else batch["input_ids"]
        z = x
        for _ in range(k):
            z = x @ x
        (z[0, 0] + ids.reshape(-1)[:1].float().sum()).item()  # a sync per step, as logging the loss does
        now = time.perf_counter()
        times.append(now - t)
        t = now
        if i + 1 >= steps:
            break
    warm = sorted(times[2:])
    return warm[len(warm) // 2]


def bench_prefetch(ds: PackedDataset, batch_size: int, compute_ms: float, steps: int) -> None:
    if not torch.cuda.is_available():
        print("\nDevicePrefetcher: skipped (no CUDA device; on CPU it passes the loader's batches through unchanged)")
        return
    x = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        x @ x
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        x @ x
    torch.cuda.synchronize()
    k = max(1, round(compute_ms / 1e3 / ((time.perf_counter() - t) / 20)))
    print(f"\nDevicePrefetcher on {torch.cuda.get_device_name()}: B={batch_size} x N={ds.size}, step = {k} matmuls "
          f"4096^2 + .item(), median of {steps} steps")
    print(f"{'loader':22} {'load s':>8} {'compute s':>10} {'serial s':>9} {'prefetched s':>13} {'serial/floor':>13} "
          f"{'prefetched/floor':>17}")
    compute = _median_step(({"input_ids": x} for _ in range(steps)), x, k, False, steps)
    for name, delay in ((f"w=0 + {compute_ms:.0f} ms sleep", compute_ms / 1e3), ("w=0 as it is", 0.0)):

        def loader(delay: float = delay):  # type: ignore[no-untyped-def]
            sampler = PackedSampler(ds, seed=0)
            inner = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=sampler,
                                                collate_fn=PackedCollator(flatten=True))  # fmt: skip
            return _Delayed(inner, delay)

        t = time.perf_counter()
        n = sum(1 for _ in itertools.islice(loader(), steps))
        load = (time.perf_counter() - t) / n
        serial = _median_step(loader(), x, k, True, steps)
        prefetched = _median_step(DevicePrefetcher(loader(), "cuda"), x, k, False, steps)
        floor = max(load, compute)
        print(f"{name:22} {load:8.4f} {compute:10.4f} {serial:9.4f} {prefetched:13.4f} {serial / floor:13.2f} "
              f"{prefetched / floor:17.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000_000, help="tokens per store (uint16: 2 bytes each)")
    ap.add_argument("--shapes", default="8x4096,32x4096,16x8192", help="comma-separated BxN batch shapes")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is reported")
    ap.add_argument("--max-batches", type=int, default=2000, help="batches per run at most")
    ap.add_argument("--threads", type=int, default=min(2, numba.config.NUMBA_NUM_THREADS),
                    help="numba threads for the parallel w=0 run (at most NUMBA_NUM_THREADS)")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the stores (default: a temp dir)")
    ap.add_argument("--prefetch-ms", type=float, default=30.0, help="DevicePrefetcher: load delay and compute per step")
    ap.add_argument("--prefetch-steps", type=int, default=30, help="DevicePrefetcher: steps timed per run")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        datasets = {}
        for size in sorted({n for _, n in shapes}):
            directory = (args.dir or Path(tmp)) / f"n{size}" / "packed" / "bench"
            t0 = time.perf_counter()
            build_store(directory, args.tokens, size)
            ds = datasets[size] = PackedDataset(directory)
            store = ds._open()
            print(f"store N={size}: {len(ds)} packs ({store.tokens.nbytes / 1e6:.0f} MB), {store.seg_lens.size} segments, "
                  f"built in {time.perf_counter() - t0:.1f}s")
        threads = max(1, min(args.threads, numba.config.NUMBA_NUM_THREADS))
        print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads; loader kernel: 1 and {threads} numba "
              f"threads (NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}); raw reads: 1 thread (numpy)")
        for b, n in shapes:
            bench_shape(datasets[n], b, args.repeat, args.max_batches, threads)
        print(f"numba threading layer: {numba.threading_layer() if threads > 1 else 'none (serial kernel)'}")
        b, n = shapes[0]
        bench_prefetch(datasets[n], b, args.prefetch_ms, args.prefetch_steps)


if __name__ == "__main__":
    main()
