"""Item orders fed to the packers: seeded decreasing (ties broken by a seeded shuffle) and shuffled.

Lengths are bounded by the capacity, so a counting sort gives the decreasing order in O(n + C)
instead of O(n log n); breaking ties with a seeded permutation first keeps equal-length documents
from landing in packs by their position in the corpus while staying reproducible for a seed.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _counting_sort_desc(lengths: np.ndarray, perm: np.ndarray, capacity: int) -> np.ndarray:
    """Stable (w.r.t. `perm`) counting sort of item indices by decreasing length."""
    counts = np.zeros(capacity + 2, np.int64)
    for i in range(lengths.size):
        counts[capacity - lengths[i] + 1] += 1
    for v in range(1, capacity + 2):
        counts[v] += counts[v - 1]
    out = np.empty(lengths.size, np.int64)
    for j in range(perm.size):
        item = perm[j]
        key = capacity - lengths[item]
        out[counts[key]] = item
        counts[key] += 1
    return out


def decreasing_order(lengths: np.ndarray, capacity: int, rng: np.random.Generator) -> np.ndarray:
    """Item indices by decreasing length; equal lengths in a seeded random order."""
    perm = rng.permutation(lengths.size).astype(np.int64, copy=False)
    return _counting_sort_desc(lengths, perm, int(capacity))


def shuffled_order(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Item indices in a seeded random order (first-fit shuffle)."""
    return rng.permutation(lengths.size).astype(np.int64, copy=False)
