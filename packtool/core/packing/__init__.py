"""Whole-dataset bin packing of document lengths into fixed-size packs.

`pack_lengths` validates the lengths, runs one registered packer (numba, O(n + C) or
O(n log B)), then numbers the packs in a seeded random order so that pack index does not
correlate with document length (FFD fills its first packs with the longest documents).

Speed and pack counts against the lower bound are measured by scripts/bench_pack.py
(docs/BENCHMARKS.md). With a binding `max_items_per_pack` the decreasing packers spend the
slots on mid-size documents, and ffs usually needs fewer packs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packtool.choices import Algorithm
from packtool.core.packing.registry import ALGORITHMS, Packer
from packtool.errors import ConfigError

__all__ = ["ALGORITHMS", "MAX_CAPACITY", "Packer", "lower_bound", "pack_lengths"]

# The packers index arrays by length and remaining capacity (counting sort, best-fit stacks)
# and keep int32 capacities in the first-fit tree: 2**26 tokens keeps those at ~1 GB at most.
MAX_CAPACITY = 1 << 26


def lower_bound(lengths: np.ndarray, capacity: int, max_items_per_pack: int | None = None) -> int:
    """Fewest packs any packer can reach: ceil(total / capacity), at least 1 for non-empty input,
    and at least ceil(n / K) when at most K items may share a pack."""
    lengths = np.asarray(lengths)
    n = int(lengths.size)
    if n == 0:
        return 0
    bound = max(1, -(-int(lengths.sum(dtype=np.int64)) // int(capacity)))
    if max_items_per_pack is not None:
        bound = max(bound, -(-n // int(max_items_per_pack)))
    return bound


def _validate(lengths: object, capacity: int, max_items_per_pack: int | None) -> np.ndarray:
    """The lengths as a contiguous int64 array, or ConfigError naming what is wrong and how to fix it."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ConfigError(f"pack capacity must be a positive integer, got {capacity!r}; pass e.g. --size 4096")
    if capacity > MAX_CAPACITY:
        raise ConfigError(
            f"pack capacity {capacity} is over the supported maximum {MAX_CAPACITY}; use a smaller --size"
        )
    if max_items_per_pack is not None and (
        isinstance(max_items_per_pack, bool)
        or not isinstance(max_items_per_pack, (int, np.integer))
        or max_items_per_pack < 1
    ):
        raise ConfigError(
            f"max items per pack must be a positive integer or None, got {max_items_per_pack!r}; "
            "pass --max-docs-per-pack K with K >= 1 or leave it out"
        )
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ConfigError(f"lengths must be a 1-D array, got shape {arr.shape}; flatten it first")
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"lengths must be integers, got dtype {arr.dtype}; cast them with .astype(np.int64)")
    if arr.min() < 0:
        i = int(np.argmax(arr < 0))
        raise ConfigError(f"lengths must be >= 0, got {int(arr[i])} at index {i}; drop or fix that item")
    if int(arr.max()) > int(capacity):
        i = int(np.argmax(arr > capacity))
        raise ConfigError(
            f"item {i} has length {int(arr[i])}, over the pack capacity {int(capacity)}; "
            "split or truncate over-long documents first (packtool pack --overlong split|truncate|drop)"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


@njit(cache=True)
def _group(items: np.ndarray, bins: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counting sort of placements by final pack number, keeping placement order inside a pack."""
    n_bins = rank.size
    offsets = np.zeros(n_bins + 1, np.int64)
    for t in range(bins.size):
        offsets[rank[bins[t]] + 1] += 1
    for p in range(n_bins):
        offsets[p + 1] += offsets[p]
    cursor = offsets[:-1].copy()
    order = np.empty(items.size, np.int64)
    for t in range(items.size):
        p = rank[bins[t]]
        order[cursor[p]] = items[t]
        cursor[p] += 1
    return offsets, order


def pack_lengths(
    lengths: np.ndarray,
    capacity: int,
    algorithm: str | Algorithm = Algorithm.BFD,
    seed: int = 0,
    shuffle: bool = True,
    max_items_per_pack: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pack items of the given lengths into packs of `capacity`; returns `(pack_offsets, order)`.

    Pack p holds items `order[pack_offsets[p]:pack_offsets[p+1]]` (int64 arrays), every item exactly
    once, no pack over capacity, at most `max_items_per_pack` items per pack. Same inputs and seed give
    the same result. With `shuffle` the packs come in a seeded random order; without it, in the
    order the algorithm opened them. Items inside a pack keep their placement order.
    """
    name = str(algorithm)
    packer = ALGORITHMS.get(name)
    if packer is None:
        raise ConfigError(f"unknown packing algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    arr = _validate(lengths, capacity, max_items_per_pack)
    n = arr.size
    if n == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    # a cap above n never binds: n + 1 behaves the same in every packer and fits the compiled int64
    max_items = n + 1 if max_items_per_pack is None else min(int(max_items_per_pack), n + 1)
    rng = np.random.default_rng(seed)
    items, bins, n_bins = packer(arr, int(capacity), max_items, rng)
    rank = rng.permutation(n_bins) if shuffle else np.arange(n_bins)
    return _group(items, bins, rank.astype(np.int64, copy=False))
