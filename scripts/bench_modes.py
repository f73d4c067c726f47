"""Benchmark: the batching modes' per-batch cost against a raw read, and dynamic batching's waste.

Part 1, per-batch cost (main process, no DataLoader; best of --repeat interleaved rounds over the
same batches, the machine may be shared). Each mode is timed next to the raw read of the SAME tokens in the same run:
  raw bytes     the batch's stored token bytes copied out of the memmap (`tokens[idx]` for packs; one
                fancy-index gather over the documents' ranges, index built vectorised, for documents);
  raw + int64   the same plus `torch.from_numpy(x.astype(int64))`;
  packs         PackedDataset + PackedCollator(flatten=True), B x N packs;
  packs CP=C    the same with `cp_size=C, cp_rank=0` (one rank's share, `shift_labels` included);
  docs flat     DocumentDataset + PackedCollator(flatten=True) over DynamicBatchSampler batches
                (sum of lengths <= B*N): the padding-free minibatch;
  docs padded   DocumentDataset + PaddedCollator(round_to=64) over DynamicBatchSampler(padded=True).
Part 2, waste (share of computed positions that are padding) on a Zipf-like corpus at the same
budget B*N: random batches of B documents padded to their longest, length-sorted batches of B,
padded dynamic batching (window 1024; and with split_gain=1, NeMo-RL's plain greedy), unpadded dynamic batching padded to the budget
(`pad_to_length=B*N`, static shapes), and the packing lower bound.
Part 3, planning time of one epoch (`DynamicBatchSampler`'s plan + rank assignment) for 1M and 10M
documents, against `rng.permutation(n)` (what any shuffling sampler does) in the same run.

    python scripts/bench_modes.py [--tokens 50000000] [--batch 8] [--size 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from bench_loader import build_store  # noqa: E402  (scripts/ is on sys.path when run as a script)

from packtool.core.batching import DEFAULT_WINDOW, assign_ranks, plan_batches
from packtool.formats.token_store import TokenStoreWriter
from packtool.loader import DocumentDataset, DynamicBatchSampler, PackedCollator, PackedDataset, PaddedCollator


def zipf_lengths(n: int, rng: np.random.Generator, cap: int) -> np.ndarray:
    """Zipf(1.6) x 40 tokens plus jitter, capped at `cap` (p50 ~100, p90 ~1100, ~5% at the cap)."""
    base = np.minimum(rng.zipf(1.6, size=n), cap) * 40  # clip first: zipf can overflow
    return np.minimum(base + rng.integers(0, 40, size=n), cap).astype(np.int64)


def build_token_store(directory: Path, n_tokens: int, cap: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lengths = zipf_lengths(n_tokens // 100, rng, cap)
    lengths = lengths[np.cumsum(lengths) <= n_tokens]
    directory.mkdir(parents=True)
    writer = TokenStoreWriter(directory, np.dtype("<u2"))
    block = 100_000
    for a in range(0, lengths.size, block):
        part = lengths[a : a + block]
        writer.append(rng.integers(0, 50_000, size=int(part.sum()), dtype=np.uint16), part)
    writer.finish({"packtool_version": "bench", "tokenizer": {"name": "bench", "sha256": "0" * 64, "vocab_size": 50_000,
                                                              "bos_id": None, "eos_id": 0, "pad_id": 0}})


def build_pack_store(directory: Path, n_tokens: int, size: int, unit: int = 64, seed: int = 0) -> None:
    """bench_loader's store with every document length (so every segment) a multiple of `unit`, so the
    store can be split for context parallelism up to cp_size = unit / 2."""
    build_store(directory, n_tokens, size, seed=seed, unit=unit)


def each(fn: Callable[[object], object], batches: list) -> None:
    """Run `fn` on every batch, dropping each result before the next (as a training loop does; keeping
    them all would defeat the loaders' buffer reuse and time page faults instead)."""
    for b in batches:
        fn(b)


def best(run: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def interleaved(runs: dict[str, Callable[[], None]], repeat: int) -> dict[str, float]:
    """Best time of each run over `repeat` rounds, the runs taking turns in every round (the VM is
    shared: a burst of load then hits every mode, not one)."""
    out = {name: float("inf") for name in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            out[name] = min(out[name], best(run, 1))
    return out


def doc_gather_index(starts: np.ndarray, lengths: np.ndarray, idx: list[int]) -> np.ndarray:
    lens = lengths[idx]
    first = np.cumsum(lens) - lens
    return np.repeat(starts[idx] - first, lens) + np.arange(int(lens.sum()))


def report(title: str, n_batches: int, n_tokens: int, results: dict[str, float]) -> None:
    raw, raw64 = results["raw bytes"], results["raw + int64"]
    print(f"\n{title}: {n_batches} batches, {n_tokens / n_batches / 1e3:.1f}k tokens per batch on average")
    print(f"{'':16} {'us/batch':>10} {'Mtokens/s':>10} {'x raw bytes':>12} {'x raw+int64':>12}")
    for name, sec in results.items():
        print(f"{name:16} {sec / n_batches * 1e6:10.1f} {n_tokens / sec / 1e6:10.1f} {sec / raw:12.2f} {sec / raw64:12.2f}")


def bench_packs(root: Path, batch: int, repeat: int, max_batches: int) -> None:
    ds = PackedDataset(root)
    tokens = ds._open().tokens
    order = np.random.default_rng(1).permutation(len(ds))
    batches = [order[i : i + batch] for i in range(0, order.size - batch + 1, batch)][:max_batches]
    collators = {"packs": PackedCollator(flatten=True)}
    collators |= {f"packs CP={c}": PackedCollator(cp_size=c, cp_rank=0) for c in (2, 4)}
    for collate in collators.values():  # warm the page cache and the numba kernels
        for idx in batches[:20]:
            collate(ds.__getitems__(idx))
    runs: dict[str, Callable[[], None]] = {
        "raw bytes": lambda: each(lambda idx: tokens[idx], batches),
        "raw + int64": lambda: each(lambda idx: torch.from_numpy(tokens[idx].astype(np.int64)), batches),
    }
    for name, collate in collators.items():
        runs[name] = lambda collate=collate: each(lambda idx: collate(ds.__getitems__(idx)), batches)
    results = interleaved(runs, repeat)
    report(f"packs {batch} x {ds.size}", len(batches), len(batches) * batch * ds.size, results)


def bench_documents(path: Path, budget: int, repeat: int, max_batches: int) -> None:
    ds = DocumentDataset(path)
    store = ds._open()
    tokens, starts = np.asarray(store.tokens), store.starts
    for padded, collate, name in ((False, PackedCollator(flatten=True), "docs flat"),
                                  (True, PaddedCollator(round_to=64), "docs padded")):
        batches = DynamicBatchSampler(ds, budget, padded=padded, round_to=64 if padded else 1, seed=1).batches()[:max_batches]
        gathers = [doc_gather_index(starts, ds.lengths, b) for b in batches]  # the raw read's index, built once
        for b in batches[:20]:
            collate(ds.__getitems__(b))
        runs: dict[str, Callable[[], None]] = {
            "raw bytes": lambda gathers=gathers: each(lambda g: tokens[g], gathers),
            "raw + int64": lambda gathers=gathers: each(lambda g: torch.from_numpy(tokens[g].astype(np.int64)), gathers),
            name: lambda batches=batches, collate=collate: each(lambda docs: collate(ds.__getitems__(docs)), batches),
        }
        results = interleaved(runs, repeat)
        n_tok = int(sum(ds.lengths[b].sum() for b in batches))
        report(f"{name}: DynamicBatchSampler(max_tokens={budget}, padded={padded})", len(batches), n_tok, results)


def padded_computed(lengths: np.ndarray, batch: int) -> int:
    n = lengths.size
    rows = np.zeros(-(-n // batch) * batch, np.int64)
    rows[:n] = lengths
    return int((rows.reshape(-1, batch).max(axis=1) * batch).sum()) - int(
        rows.reshape(-1, batch).max(axis=1)[-1] * ((-n) % batch)
    )


def bench_waste(n_docs: int, batch: int, size: int) -> None:
    rng = np.random.default_rng(0)
    lengths = zipf_lengths(n_docs, rng, size)
    total, budget = int(lengths.sum()), batch * size
    computed = {
        f"random batches of {batch}": padded_computed(lengths[rng.permutation(n_docs)], batch),
        f"sorted batches of {batch}": padded_computed(np.sort(lengths), batch),
    }
    order = rng.permutation(n_docs)
    dyn = plan_batches(lengths, budget, padded=True, window=DEFAULT_WINDOW, order=order)
    computed[f"dynamic padded (B*N={budget})"] = int(dyn.cost.sum())
    greedy = plan_batches(lengths, budget, padded=True, window=DEFAULT_WINDOW, order=order, split_gain=1.0)
    computed["  the same, split_gain=1 (greedy)"] = int(greedy.cost.sum())
    flat = plan_batches(lengths, budget, order=rng.permutation(n_docs))
    computed["dynamic varlen, pad_to_length=B*N"] = flat.n_batches * budget
    computed["packing lower bound"] = -(-total // size) * size
    p = np.percentile(lengths, [50, 90, 99])
    print(f"\nwaste on {n_docs} Zipf-like documents (p50 {p[0]:.0f}, p90 {p[1]:.0f}, p99 {p[2]:.0f}, max {lengths.max()}), "
          f"N={size}, B={batch}")
    print(f"{'strategy':38} {'waste':>8}")
    for name, c in computed.items():
        print(f"{name:38} {1 - total / c:8.2%}")
    print(f"dynamic padded: {dyn.n_batches} batches ({greedy.n_batches} greedy), {n_docs / dyn.n_batches:.1f} documents per batch on average")


def bench_planning(sizes: list[int]) -> None:
    print(f"\n{'documents':>10} {'permutation s':>14} {'plan varlen s':>14} {'plan padded s':>14} {'x perm (padded)':>16}")
    for n in sizes:
        rng = np.random.default_rng(0)
        lengths = zipf_lengths(n, rng, 4096)
        perm = best(lambda n=n: np.random.default_rng(1).permutation(n), 2)
        times = []
        for padded in (False, True):
            def run(padded: bool = padded, lengths: np.ndarray = lengths) -> None:
                r = np.random.default_rng(1)
                plan = plan_batches(lengths, 32768, padded=padded, order=r.permutation(lengths.size))
                cost = plan.cost[: plan.n_batches - plan.n_batches % 8]
                assign_ranks(cost, 8, r)
            times.append(best(run, 2))
        print(f"{n:>10} {perm:14.3f} {times[0]:14.3f} {times[1]:14.3f} {times[1] / perm:16.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=50_000_000, help="tokens per store (uint16)")
    ap.add_argument("--batch", type=int, default=8, help="B: packs per batch; budget B*N for documents")
    ap.add_argument("--size", type=int, default=4096, help="N: pack size, and the document length cap")
    ap.add_argument("--repeat", type=int, default=7, help="rounds; the best of each mode is reported")
    ap.add_argument("--max-batches", type=int, default=500)
    ap.add_argument("--plan-docs", default="1000000,10000000", help="document counts for the planning timing")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build_pack_store(Path(tmp) / "packs" / "packed" / "bench", args.tokens, args.size)
        build_token_store(Path(tmp) / "tokens", args.tokens, args.size)
        print(f"stores built in {time.perf_counter() - t0:.1f}s ({args.tokens / 1e6:.0f}M tokens each)")
        bench_packs(Path(tmp) / "packs", args.batch, args.repeat, args.max_batches)
        bench_documents(Path(tmp) / "tokens", args.batch * args.size, args.repeat, args.max_batches)
    bench_waste(1_000_000, args.batch, args.size)
    bench_planning([int(x) for x in args.plan_docs.split(",")])


if __name__ == "__main__":
    main()
