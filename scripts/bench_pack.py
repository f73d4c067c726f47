"""Benchmark `packtool.pack_lengths` on lognormal(mu=6, sigma=1) lengths clipped to [1, 4096].

Reports, per algorithm and size (1M and 10M by default), the best-of-R wall time in seconds, the
number of packs and packs / lower bound (ceil(total / C)). Numba compile time is EXCLUDED: every
algorithm is warmed up on a small input first. Run single-threaded for comparable numbers:

    NUMBA_NUM_THREADS=1 python scripts/bench_pack.py [--sizes 1000000 10000000] [--repeat 2]

A plain-Python FFD (list of bins, linear first-fit scan, as simple packers do it) is timed in the
same run on a 100k subset, and reported as a ratio against our FFD on the same 100k.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from packtool.core.packing import ALGORITHMS, lower_bound, pack_lengths  # noqa: E402

CAPACITY = 4096


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.0, 1.0, n), 1, CAPACITY).astype(np.int64)


def python_ffd(lengths: list[int], capacity: int) -> list[list[int]]:
    """The baseline: sort descending, then scan the open bins linearly for the first that fits."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        x = lengths[i]
        for b, r in enumerate(room):
            if r >= x:
                bins[b].append(i)
                room[b] = r - x
                break
        else:
            bins.append([i])
            room.append(capacity - x)
    return bins


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--baseline-size", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    warm = lognormal_lengths(1000, seed=99)
    for name in ALGORITHMS:
        pack_lengths(warm, CAPACITY, name)
    print(f"capacity {CAPACITY}, lognormal(6, 1) clipped to [1, {CAPACITY}], "
          f"NUMBA_NUM_THREADS={os.environ['NUMBA_NUM_THREADS']}, numba compile excluded (warmed up)")
    print(f"{'n':>10} {'algorithm':>9} {'seconds':>9} {'packs':>10} {'packs/LB':>10}")
    for n in args.sizes:
        lengths = lognormal_lengths(n)
        bound = lower_bound(lengths, CAPACITY)
        for name in ALGORITHMS:
            seconds, (offsets, _) = best_time(lambda x=lengths, a=name: pack_lengths(x, CAPACITY, a), args.repeat)
            packs = offsets.size - 1
            print(f"{n:>10} {name:>9} {seconds:>9.3f} {packs:>10} {packs / bound:>10.6f}")

    n = args.baseline_size
    lengths = lognormal_lengths(n, seed=1)
    as_list = lengths.tolist()
    base_s, base_bins = best_time(lambda: python_ffd(as_list, CAPACITY), 1)
    ours_s, (offsets, _) = best_time(lambda: pack_lengths(lengths, CAPACITY, "ffd"), max(args.repeat, 3))
    print(f"\nplain-Python FFD on {n}: {base_s:.3f} s, {len(base_bins)} packs; "
          f"ours (ffd): {ours_s:.4f} s, {offsets.size - 1} packs; speed-up x{base_s / ours_s:.0f}")
    compare_trl(lengths, args.repeat)


def compare_trl(lengths: np.ndarray, repeat: int) -> None:
    """TRL's BFD (`trl.data_utils._pack_bfd`, what `pack_dataset(strategy="bfd")` runs per map batch)
    on the same lengths, when trl is installed. It packs a whole pyarrow table of token lists (its only
    entry point), so its time includes the arrow gathers of the token column: zeros here, same lengths."""
    try:
        import pyarrow as pa
        from trl.data_utils import _pack_bfd
    except ImportError:
        print("TRL not installed (pip install trl): its BFD is not compared")
        return
    import trl

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    column = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(np.zeros(int(offsets[-1]), np.int32)))
    table = pa.Table.from_arrays([column], names=["input_ids"])
    trl_s, packed = best_time(lambda: _pack_bfd(table, CAPACITY), 1)
    ours_s, (ours, _) = best_time(lambda: pack_lengths(lengths, CAPACITY, "bfd"), max(repeat, 3))
    print(f"TRL {trl.__version__} _pack_bfd on {lengths.size} (whole table, one window): {trl_s:.3f} s, {len(packed)} packs; "
          f"ours (bfd): {ours_s:.4f} s, {ours.size - 1} packs; speed-up x{trl_s / ours_s:.0f}")


if __name__ == "__main__":
    main()
