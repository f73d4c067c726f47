"""Benchmark: step efficiency of data-parallel ranks, plain vs balanced pack order (`PackedSampler(balance=)`).

Step efficiency = mean rank cost / max rank cost of one global step (W ranks x B packs each), under
the issue's cost model of a 7B-shaped model (`CostModel.from_shape(4096)`: 24·h² per token and
2·h·s² per segment, per layer). Packs are built from lengths alone (`packtool.pack_lengths`, BFD,
documents longer than N split into fragments of N as `pack --overlong split` does), so no tokens are
needed. Two corpora of document lengths:
  zipf   Zipf(1.6) x 40 tokens plus jitter (p50 ~60, a heavy tail; capped at 131k before splitting);
  real   a lognormal mixture: 85% around 300 tokens (sigma 1.0), 15% around 2,500 (sigma 1.3): long-tailed
         like mail/web text.
Part 1: N = 4096, 16384, 65536; W = 8 and 64; B = 1 and 2; plain vs balanced at the default window;
  planning time per step (the balanced plan of one epoch / steps, best of 3) next to the plain order
  (`epoch_order`, a permutation) timed in the same run; how far a pack moved (measured, in steps).
Part 2: the window K (W = 8) on a small corpus (12M tokens, the issue's scale: few windows per epoch)
  and a large one, and (2b) under cost models of other hidden sizes: the data the default window was
  chosen on.
Part 3 (deliverable 5, a pack-time option): the plain and balanced efficiency of every packing
  algorithm, and an upper bound for ANY pack-time option that keeps documents whole: pack costs
  water-filled to the flattest distribution they can reach (a pack never costs less than its
  longest segment), then dealt in the plain order.
Part 4: documents: `DynamicBatchSampler`'s batches (16k-token budget, 8 ranks) dealt to ranks by token
  count (the default) or by the cost model (`balance=`), both priced by the model.

    python scripts/bench_balance.py [--tokens 1000000000] [--small 12000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from packtool import CostModel, pack_lengths  # noqa: E402
from packtool.core.balance import (  # noqa: E402
    DEFAULT_WINDOW,
    balanced_order,
    epoch_order,
    max_displacement,
    step_costs,
    step_efficiency,
)
from packtool.core.batching import assign_ranks, plan_batches, priced  # noqa: E402
from packtool.core.packing import ALGORITHMS  # noqa: E402

MODEL = CostModel.from_shape(4096)
SIZES = (4096, 16384, 65536)


def zipf_lengths(n_tokens: int, rng: np.random.Generator) -> np.ndarray:
    n = n_tokens // 150
    lens = np.minimum(np.minimum(rng.zipf(1.6, size=n), 3300) * 40 + rng.integers(0, 40, size=n), 131072)
    return lens[np.cumsum(lens) <= n_tokens].astype(np.int64)


def real_lengths(n_tokens: int, rng: np.random.Generator) -> np.ndarray:
    n = n_tokens // 600
    lens = np.where(rng.random(n) < 0.85, rng.lognormal(np.log(300), 1.0, n), rng.lognormal(np.log(2500), 1.3, n))
    lens = np.maximum(1, lens).astype(np.int64)
    return lens[np.cumsum(lens) <= n_tokens]


def packs(lengths: np.ndarray, size: int, algorithm: str = "bfd") -> tuple[np.ndarray, np.ndarray]:
    """(pack_offsets, seg_lens) of the documents split at `size` and packed."""
    items = np.concatenate([np.repeat(size, int((lengths // size).sum())), (lengths % size)[lengths % size > 0]])
    po, order = pack_lengths(items, size, algorithm=algorithm, seed=0)
    return po, items[order]


def best(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t = min(t, time.perf_counter() - t0)
    return t, out


def flattened(po: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Water-filled pack costs: the flattest any re-packing of whole documents could make them (total
    cost fixed, each pack at least the cost of its tokens and its longest segment)."""
    cost = MODEL.packs(po, lens)
    tokens = np.add.reduceat(lens.astype(np.int64), po[:-1])
    longest = np.maximum.reduceat(lens.astype(np.int64), po[:-1])
    floor = MODEL.combine(tokens, longest * longest)
    total = cost.sum()
    lo, hi = floor.min(), cost.max() + total
    for _ in range(100):  # bisect the water level
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.maximum(floor, mid).sum() < total else (lo, mid)
    return np.maximum(floor, hi)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1_000_000_000, help="tokens of the large corpora")
    ap.add_argument("--small", type=int, default=12_000_000, help="tokens of the small corpora (the issue's scale)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(f"cost model: h=4096 (per_token {MODEL.per_token:.3g}, per_token_sq {MODEL.per_token_sq:.3g}); "
          f"default window {DEFAULT_WINDOW} steps\n")
    rng = np.random.default_rng(0)
    corpora = {name: fn(args.tokens, rng) for name, fn in (("zipf", zipf_lengths), ("real", real_lengths))}
    small = {name: fn(args.small, rng) for name, fn in (("zipf", zipf_lengths), ("real", real_lengths))}

    print("Part 1: plain vs balanced at the default window (mean / 5th percentile step efficiency)")
    head = f"{'corpus':<6}{'N':>7}{'packs':>9}{'W':>4}{'B':>3}{'steps':>8}  {'plain':>17}  {'balanced':>17}"
    print(head + f"{'saved':>8}{'plan us/step':>14}{'x perm':>8}{'moved':>7}")
    for name, lengths in corpora.items():
        for size in SIZES:
            po, lens = packs(lengths, size)
            cost = MODEL.packs(po, lens)
            n = cost.size
            for world in (8, 64):
                for micro in (1, 2):
                    t_plain, plain = best(lambda: epoch_order(n, 0, 0, world=world), args.repeat)  # noqa: B023
                    t_bal, bal = best(
                        lambda: balanced_order(plain, cost, world=world, micro_batches=micro),  # noqa: B023
                        args.repeat,
                    )
                    p = step_efficiency(step_costs(plain, cost, world, micro))  # type: ignore[arg-type]
                    b = step_efficiency(step_costs(bal, cost, world, micro))  # type: ignore[arg-type]
                    moved = max_displacement(plain, bal, world, micro)  # type: ignore[arg-type]
                    print(f"{name:<6}{size:>7}{n:>9}{world:>4}{micro:>3}{p.steps:>8}  "
                          f"{p.mean:>8.2%} {p.p5:>8.2%}  {b.mean:>8.2%} {b.p5:>8.2%}"
                          f"{1 - b.step_time / p.step_time:>8.2%}{1e6 * t_bal / p.steps:>14.2f}"
                          f"{t_bal / t_plain:>8.1f}{moved:>7}")

    print("\nPart 2: the window K at W = 8 (mean / 5th percentile; balanced)")
    windows = (16, 32, 64, 128, 256)
    print(f"{'corpus':<12}{'N':>7}{'B':>3}{'steps':>7}  {'plain':>15}" + "".join(f"{'K=' + str(k):>17}" for k in windows))
    for label, group in (("small", small), ("large", corpora)):
        for name, lengths in group.items():
            for size in (4096, 16384):
                po, lens = packs(lengths, size)
                cost = MODEL.packs(po, lens)
                for micro in (1, 2):
                    plain = epoch_order(cost.size, 0, 0, world=8)
                    p = step_efficiency(step_costs(plain, cost, 8, micro))
                    row = f"{label + ' ' + name:<12}{size:>7}{micro:>3}{p.steps:>7}  {p.mean:>7.2%} {p.p5:>7.2%}"
                    for k in windows:
                        b = step_efficiency(step_costs(balanced_order(plain, cost, world=8, micro_batches=micro,
                                                                      window=k), cost, 8, micro))
                        row += f"  {b.mean:>7.2%} {b.p5:>7.2%}"
                    print(row)

    print("\nPart 2b: the cost model (hidden size h; smaller h = attention weighs more), small corpora, W = 8, B = 1")
    print(f"{'corpus':<12}{'N':>7}{'h':>6}  {'plain':>15}" + "".join(f"{'K=' + str(k):>17}" for k in (64, 128, 256)))
    for name, lengths in small.items():
        po, lens = packs(lengths, 16384)
        for h in (1024, 2048, 4096, 8192):
            cost = CostModel.from_shape(h).packs(po, lens)
            plain = epoch_order(cost.size, 0, 0, world=8)
            p = step_efficiency(step_costs(plain, cost, 8))
            row = f"{'small ' + name:<12}{16384:>7}{h:>6}  {p.mean:>7.2%} {p.p5:>7.2%}"
            for k in (64, 128, 256):
                b = step_efficiency(step_costs(balanced_order(plain, cost, world=8, window=k), cost, 8))
                row += f"  {b.mean:>7.2%} {b.p5:>7.2%}"
            print(row)

    print("\nPart 3: a pack-time option? (real corpus, W = 8, B = 1; mean / 5th percentile)")
    print(f"{'N':>7}{'packing':>22}{'packs':>8}{'cost CV':>9}  {'plain':>15}  {'balanced':>15}")
    for size in (4096, 16384):
        for algorithm in [*ALGORITHMS, "ideal flattened (bound)"]:
            if algorithm in ALGORITHMS:
                po, lens = packs(corpora["real"], size, algorithm)
                cost = MODEL.packs(po, lens)
            else:
                po, lens = packs(corpora["real"], size)
                cost = flattened(po, lens)
            plain = epoch_order(cost.size, 0, 0, world=8)
            p = step_efficiency(step_costs(plain, cost, 8))
            b = step_efficiency(step_costs(balanced_order(plain, cost, world=8), cost, 8))
            print(f"{size:>7}{algorithm:>22}{cost.size:>8}{cost.std() / cost.mean():>9.3f}  "
                  f"{p.mean:>7.2%} {p.p5:>7.2%}  {b.mean:>7.2%} {b.p5:>7.2%}")

    print("\nPart 4: documents, DynamicBatchSampler(max_tokens=16384), W = 8: ranks dealt by tokens vs by cost")
    print(f"{'corpus':<8}{'padded':>7}{'steps':>7}  {'by tokens':>15}  {'by cost':>15}{'saved':>8}")
    for name, lengths in small.items():
        lengths = np.minimum(lengths, 16384)
        for padded in (False, True):
            order = np.random.default_rng(0).permutation(lengths.size)
            plan = plan_batches(lengths, 16384, padded=padded, order=order)
            keep = plan.n_batches // 8 * 8
            tokens, model_cost = plan.cost[:keep], priced(plan, lengths, MODEL, padded, 1)[:keep]
            a = step_efficiency(model_cost[assign_ranks(tokens, 8, np.random.default_rng(1))])
            b = step_efficiency(model_cost[assign_ranks(model_cost, 8, np.random.default_rng(1))])
            print(f"{name:<8}{padded!s:>7}{a.steps:>7}  {a.mean:>7.2%} {a.p5:>7.2%}  {b.mean:>7.2%} {b.p5:>7.2%}"
                  f"{1 - b.step_time / a.step_time:>8.2%}")


if __name__ == "__main__":
    main()
