"""Sequential concatenation: documents in corpus order, a new pack when the next one does not fit.

The baseline every packer is compared with: O(n), keeps document order, and wastes on average
about half a typical document per pack. It never splits; over-long documents are split upstream.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _concat_bins(lengths: np.ndarray, capacity: int, max_items: int) -> tuple[np.ndarray, int]:
    n = lengths.size
    bins = np.empty(n, np.int64)
    b = -1
    used = 0
    count = max_items
    for i in range(n):
        x = lengths[i]
        if count >= max_items or used + x > capacity:
            b += 1
            used = 0
            count = 0
        used += x
        count += 1
        bins[i] = b
    return bins, b + 1


def pack_concat(
    lengths: np.ndarray, capacity: int, max_items: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """Returns (items in placement order, pack of each placement, number of packs); ignores rng."""
    bins, n_bins = _concat_bins(lengths, capacity, max_items)
    return np.arange(lengths.size, dtype=np.int64), bins, n_bins
