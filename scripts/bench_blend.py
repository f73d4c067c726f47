"""Benchmark: a load-time blend of 10,000 pack stores and 10^9 samples (`packtool.loader.BlendedDataset`).

The stores are real pack stores: a few base stores are written through the library (a token store by
`TokenStoreWriter`, packed by the pack stage `pack_store`), then each of the S stores of the blend is a
directory of hard links to one base store's files (its own metadata file, identical bytes): the blend
opens, validates and maps S stores, while the disk holds the base stores once. Small packs (N = 16 by
default) keep the base stores small while the blend reaches 10^9 samples.

Measured (wall time with `time.perf_counter`, memory as the growth of this process's resident set,
`/proc/self/statm`, after the base stores are built):
  open      BlendedDataset(S sources): metadata lines only (no memory map is opened);
  resume    a rank of a 1,000-rank PackedSampler loads a state taken at 500 ranks at global sample
            9 x 10^8 (elastic) and yields its first indices; then its first batch of items (opens the
            batch's stores);
  index     `index(start, start + 10^6)` at sample 9 x 10^8 (the schedule of a range, no pack read);
  prefix    `prefix_counts(9 x 10^8)` (every store's count in the prefix, closed form).
  balanced  with --balance H: the same elastic resume of a balanced sampler (`CostModel.from_shape(H)`,
            micro_batches=1, default window), at a window boundary and 37 steps into a window (each on a
            fresh blend: both price a window from the stores' segment lengths first); and, on fresh blends,
            pricing one window of 128 x world packs by opening each store (baseline: the way before) and
            read in place (`segment_lengths`), with equal costs checked.
  baseline  in the same run: one `PackedDataset` per store (the way before the blend) over 500 stores, per store,
            and the ratio of its extrapolation to S stores over the blend's open.
Megatron's published figures are printed beside (cited, not re-measured here).

    python scripts/bench_blend.py [--stores 10000] [--samples 1000000000] [--size 16] [--work /tmp/bench_blend]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id  # noqa: E402
from packtool.stages.pack import PackConfig, pack_store  # noqa: E402

MEGATRON = [
    ("BlendedDataset index", "10 bytes per sample (int16 dataset id + int64 sample id): 10 GB at 10^9 samples"),
    ("datasets per blend", "< 32,767 (int16 dataset index)"),
    ("index build, 2,419 Dolma files", "2,000 s (argonne-lcf/Megatron-DeepSpeed#18)"),
    ("index build", "270 s (NVIDIA/Megatron-LM#795)"),
]


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def base_store(root: Path, n_packs: int, size: int, seed: int) -> Path:
    """A pack store of about `n_packs` packs, written by the library (token store, then the pack stage)."""
    tokens = root / f"tokens{seed}"
    rng = np.random.default_rng(seed)
    n_docs = n_packs * 2
    lengths = rng.integers(size // 4, size // 2 + 1, n_docs).astype(np.int64)
    ids = rng.integers(2, 1000, int(lengths.sum())).astype(np.int64)
    shutil.rmtree(tokens, ignore_errors=True)
    tokens.mkdir(parents=True)
    writer = TokenStoreWriter(tokens, dtype_for_max_id(999))
    writer.append(ids, lengths, None)
    writer.finish(
        {
            "packtool_version": "bench",
            "tokenizer": {
                "name": "bench/tok",
                "sha256": "b" * 64,
                "vocab_size": 1000,
                "bos_id": None,
                "eos_id": 1,
                "pad_id": 0,
            },
        }
    )
    out = root / f"packs{seed}"
    pack_store(PackConfig(tokens_dir=tokens, size=size, output=out).validate())
    shutil.rmtree(tokens)
    return next((out / "packed").iterdir())


def link_stores(bases: list[Path], root: Path, count: int) -> list[Path]:
    stores = []
    for i in range(count):
        d = root / f"s{i:05d}"
        if not d.exists():
            tmp = root / f".tmp{i:05d}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            for f in bases[i % len(bases)].iterdir():
                os.link(f, tmp / f.name)
            tmp.rename(d)
        stores.append(d)
    return stores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", type=int, default=10_000)
    ap.add_argument("--samples", type=int, default=10**9)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--world", type=int, default=1000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_blend"))
    ap.add_argument("--balance", type=int, default=0, help="hidden size of a CostModel: also time a balanced resume")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    per_store = args.samples // args.stores  # samples per store at weight 1, on average
    t = time.perf_counter()
    bases = []
    base_root = args.work / f"base_{args.size}_{per_store}"  # one set of base stores per shape: runs never share files
    for k, frac in enumerate((0.5, 0.8, 1.2, 1.5)):
        marker = base_root / f"base{k}"
        if not marker.exists():
            shutil.rmtree(base_root / f"packs{k}", ignore_errors=True)
            path = base_store(base_root, int(per_store * frac), args.size, k)
            marker.write_text(str(path))
        bases.append(Path(marker.read_text()))
    link_root = args.work / f"stores_{args.size}_{per_store}"
    link_root.mkdir(exist_ok=True)
    stores = link_stores(bases, link_root, args.stores)
    print(f"built {len(bases)} base stores and {len(stores)} linked stores in {time.perf_counter() - t:.1f} s")

    import torch  # noqa: F401  (imported before the measurements: the loader needs it anyway)

    from packtool.loader import BlendedDataset, PackedCollator, PackedSampler

    # each linked store's own metadata (the files it links), not the base directory's
    meta = [
        json.loads(next(s.glob(f"{args.size}_metadata.jsonl")).read_text().splitlines()[0])
        for s in stores[: len(bases)]
    ]
    n_packs = [int(m["n_packs"]) for m in meta]
    total_packs = sum(n_packs[i % len(bases)] for i in range(args.stores))
    rng = np.random.default_rng(0)
    raw = rng.uniform(0.25, 2.0, args.stores)
    scale = args.samples / float(sum(raw[i] * n_packs[i % len(bases)] for i in range(args.stores)))
    weights = [round(float(w * scale), 4) for w in raw]
    sources = [(str(s), w) for s, w in zip(stores, weights, strict=True)]

    before = rss()
    t = time.perf_counter()
    ds = BlendedDataset(sources, seed=0, size=args.size)
    open_s = time.perf_counter() - t
    open_mb = (rss() - before) / 2**20
    print(
        f"open: {args.stores} stores ({total_packs} packs), {len(ds)} samples per epoch: "
        f"{open_s:.2f} s, +{open_mb:.0f} MiB resident"
    )

    # baseline, same run: what a user did before the blend, one PackedDataset per store (every format check)
    from packtool.loader import PackedDataset

    probe = stores[: min(len(stores), 500)]
    t = time.perf_counter()
    for store in probe:
        PackedDataset(store, size=args.size)
    per_store_s = (time.perf_counter() - t) / len(probe)
    print(
        f"baseline: one PackedDataset per store: {per_store_s * 1e3:.2f} ms each (over {len(probe)} stores), "
        f"{per_store_s * args.stores:.1f} s for {args.stores}; the blend opens x{per_store_s * args.stores / open_s:.1f} faster"
    )

    old_world = args.world // 2
    at = int(0.9 * len(ds)) // old_world * old_world  # 9 x 10^8 at 10^9 samples
    t = time.perf_counter()
    old = PackedSampler(ds, num_replicas=old_world, rank=0)
    old.advance(at // old_world)
    state = old.state_dict()
    sampler = PackedSampler(ds, num_replicas=args.world, rank=7)
    sampler.load_state_dict(state)
    first = next(iter(sampler))
    resume_s = time.perf_counter() - t
    assert first == at + 7, first
    t = time.perf_counter()
    it = iter(sampler)
    keys = [next(it) for _ in range(8)]
    batch = PackedCollator()(ds.__getitems__(keys))
    batch_s = time.perf_counter() - t
    later = [[next(it) for _ in range(8)] for _ in range(10)]
    t = time.perf_counter()
    for keys in later:
        PackedCollator()(ds.__getitems__(keys))
    next_ms = (time.perf_counter() - t) / 10 * 1e3
    ds._open.clear()  # as if the LRU had evicted them: re-opened from the recorded layouts
    t = time.perf_counter()
    for keys in later:
        PackedCollator()(ds.__getitems__(keys))
    again_ms = (time.perf_counter() - t) / 10 * 1e3
    print(
        f"resume: rank 7 of {args.world} from a {old_world}-rank state at global sample {at}: first index "
        f"{first} in {resume_s:.3f} s; first batch of 8 packs ({batch['input_ids'].shape[0]} rows) in {batch_s:.3f} s, "
        f"the next ones {next_ms:.1f} ms each (first opens of 8 stores per batch), {again_ms:.1f} ms each when "
        f"their stores are re-opened after eviction (LRU of {ds.max_open} stores)"
    )
    t = time.perf_counter()
    src, packs = ds.index(at, min(at + 10**6, len(ds)))
    index_s = time.perf_counter() - t
    t = time.perf_counter()
    counts = ds.prefix_counts(at)
    prefix_s = time.perf_counter() - t
    dev = np.abs(counts - at * ds.counts / len(ds)).max()
    print(f"index: {src.size} samples at {at} in {index_s:.3f} s ({index_s * 1e9 / src.size:.0f} ns per sample)")
    print(f"prefix_counts({at}): {prefix_s:.3f} s, largest deviation from a store's share {dev:.3f} samples")
    if args.balance:
        from packtool import CostModel

        kw = {"balance": CostModel.from_shape(args.balance), "micro_batches": 1}
        boundary = at // old_world // 128 * 128  # indices per rank at a window boundary (default window)
        for label, c in (("at a window boundary", boundary), ("mid-window (37 steps in)", boundary + 37)):
            fresh = BlendedDataset(sources, seed=0, size=args.size)
            old = PackedSampler(fresh, num_replicas=old_world, rank=0, **kw)
            old.advance(c)
            grown, t = rss(), time.perf_counter()
            balanced = PackedSampler(fresh, num_replicas=args.world, rank=7, **kw)
            balanced.load_state_dict(old.state_dict())
            next(iter(balanced))
            print(
                f"balanced resume {label}: {old_world} -> {args.world} ranks at global sample {c * old_world}, "
                f"first index in {time.perf_counter() - t:.2f} s, +{(rss() - grown) / 2**20:.0f} MiB resident, "
                f"state of {len(json.dumps(balanced.state_dict()))} bytes"
            )
            del fresh, old, balanced
        # baseline, same run: pricing one window's packs by opening each store (its segment table), the way before
        # `segment_lengths`; then the same packs priced in place, on another fresh blend
        from packtool.loader.sampler_costs import costs_of, sum_costs

        window = np.arange(boundary * old_world, boundary * old_world + 128 * args.world, dtype=np.int64)
        timings = []
        for how in ("open", "read"):
            fresh = BlendedDataset(sources, seed=0, size=args.size)
            src, packs = fresh.locate(window)
            costs = np.empty(window.size)
            t = time.perf_counter()
            for s in np.unique(src).tolist():
                sel = np.flatnonzero(src == s)
                if how == "open":
                    costs[sel] = costs_of(kw["balance"], *fresh.segment_table(s), None, packs[sel])
                else:
                    costs[sel] = sum_costs(kw["balance"], *fresh.segment_lengths(s, packs[sel]), None)
            timings.append((time.perf_counter() - t, costs, np.unique(src).size))
            del fresh
        (t_open, c_open, n_src), (t_read, c_read, _) = timings
        assert np.array_equal(c_open, c_read)
        print(
            f"pricing one window ({window.size} packs from {n_src} stores): opening each store {t_open:.2f} s (baseline), "
            f"read in place {t_read:.2f} s: x{t_open / t_read:.1f}; the same costs"
        )
    total_mb = (rss() - before) / 2**20
    print(f"resident growth after all of the above: +{total_mb:.0f} MiB")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print("Megatron-LM BlendedDataset, as published (not measured here):")
    for name, figure in MEGATRON:
        print(f"  {name:<34}{figure}")
    del src, packs


if __name__ == "__main__":
    main()
