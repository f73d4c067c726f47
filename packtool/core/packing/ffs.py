"""First-fit shuffle: a seeded random order, then first fit.

Packs mix long and short documents the way the corpus does (no length-sorted packs), at the cost
of a few percent more packs than FFD on typical LLM length distributions.
"""

from __future__ import annotations

import numpy as np

from packtool.core.packing.ffd import bins_hint
from packtool.core.packing.order import shuffled_order
from packtool.core.packing.segment_tree import first_fit


def pack_ffs(
    lengths: np.ndarray, capacity: int, max_items: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """Returns (items in placement order, pack of each placement, number of packs)."""
    items, xs = shuffled_order(lengths, rng)
    bins, n_bins = first_fit(xs, capacity, max_items, bins_hint(lengths, capacity, max_items))
    return items, bins, n_bins
