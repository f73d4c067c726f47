"""Modified first-fit decreasing (Johnson & Garey 1985), the packer NeMo-RL ships as MFFD.

Items are classed by length x against capacity C: large (x > C/2), medium (C/3, C/2],
small (C/6, C/3], tiny (<= C/6). Five phases:
  1. every large item, longest first, opens its own pack;
  2. forward over those packs: add the largest medium item that fits;
  3. backward over packs that got no medium item: if the two smallest small items fit
     together, add the smallest small item, then the largest small item that still fits;
  4. forward over all packs: while the smallest remaining item fits, add the largest that fits;
  5. first-fit decreasing for whatever is left, into new packs.
Worst case 71/60·OPT + 1 packs (FFD: 11/9·OPT). "Largest remaining item <= r" is a previous-set-bit
query on a bitset over lengths, and items of one length are taken in the seeded tie order, so
each phase costs O(1) word lookups per pack or per placed item.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from packtool.core.packing.capacity_bitset import bs_clear, bs_next, bs_prev, bs_set, new_bitset
from packtool.core.packing.ffd import bins_hint
from packtool.core.packing.order import decreasing_order
from packtool.core.packing.segment_tree import first_fit


@njit(cache=True)
def _take(
    length: int, pos: np.ndarray, end: np.ndarray, ordered: np.ndarray, words: np.ndarray, offs: np.ndarray
) -> int:
    """Remove and return the next item of this length (seeded tie order)."""
    item = ordered[pos[length]]
    pos[length] += 1
    if pos[length] == end[length]:
        bs_clear(words, offs, length)
    return item


@njit(cache=True)
def _mffd(
    ordered: np.ndarray, xs: np.ndarray, capacity: int, max_items: int, hint: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The five phases over `ordered` (items by decreasing length) with lengths `xs`."""
    n = ordered.size
    # ordered is by decreasing length: items of length v sit in ordered[pos[v]:end[v]].
    pos = np.zeros(capacity + 1, np.int64)
    end = np.zeros(capacity + 1, np.int64)
    for t in range(n - 1, -1, -1):
        pos[xs[t]] = t
    for t in range(n):
        end[xs[t]] = t + 1
    n_large = 0
    while n_large < n and 2 * xs[n_large] > capacity:
        n_large += 1
    words, offs = new_bitset(capacity + 1)
    for t in range(n_large, n):
        v = xs[t]
        if t == pos[v]:
            bs_set(words, offs, v)

    items = np.empty(n, np.int64)
    bins = np.empty(n, np.int64)
    rem = np.empty(n_large, np.int64)
    cnt = np.ones(n_large, np.int64)
    has_medium = np.zeros(n_large, np.bool_)
    placed = 0
    # Phase 1: one pack per large item.
    for b in range(n_large):
        items[placed] = ordered[b]
        bins[placed] = b
        placed += 1
        rem[b] = capacity - xs[b]
    # Phase 2: forward, the largest medium item that fits.
    for b in range(n_large):
        if cnt[b] >= max_items:
            continue
        v = bs_prev(words, offs, rem[b])
        if v >= 0 and 3 * v > capacity:
            items[placed] = _take(v, pos, end, ordered, words, offs)
            bins[placed] = b
            placed += 1
            rem[b] -= v
            cnt[b] += 1
            has_medium[b] = True
    # Phase 3: backward, two small items where the two smallest fit.
    small_lo = capacity // 6 + 1  # smallest x with 6x > C
    for b in range(n_large - 1, -1, -1):
        if has_medium[b] or cnt[b] + 2 > max_items:
            continue
        s1 = bs_next(words, offs, small_lo)
        if s1 < 0 or 3 * s1 > capacity:
            break  # no small items left at all
        if end[s1] - pos[s1] >= 2:
            s2 = s1
        else:
            s2 = bs_next(words, offs, s1 + 1)
            if s2 < 0 or 3 * s2 > capacity:
                break  # fewer than two small items left
        if s1 + s2 > rem[b]:
            continue
        items[placed] = _take(s1, pos, end, ordered, words, offs)
        bins[placed] = b
        placed += 1
        rem[b] -= s1
        v = bs_prev(words, offs, min(rem[b], capacity // 3))
        items[placed] = _take(v, pos, end, ordered, words, offs)
        bins[placed] = b
        placed += 1
        rem[b] -= v
        cnt[b] += 2
    # Phase 4: forward, the largest remaining item that fits, while any fits.
    for b in range(n_large):
        while cnt[b] < max_items:
            v = bs_prev(words, offs, rem[b])
            if v < 0:
                break
            items[placed] = _take(v, pos, end, ordered, words, offs)
            bins[placed] = b
            placed += 1
            rem[b] -= v
            cnt[b] += 1
    # Phase 5: first-fit decreasing for the rest, in new packs.
    n_left = n - placed
    left = np.empty(n_left, np.int64)
    left_xs = np.empty(n_left, np.int64)
    k = 0
    for t in range(n_large, n):
        v = xs[t]
        if t >= pos[v] and t < end[v]:
            left[k] = ordered[t]
            left_xs[k] = v
            k += 1
    left_bins, n_left_bins = first_fit(left_xs, capacity, max_items, hint)
    for t in range(n_left):
        items[placed + t] = left[t]
        bins[placed + t] = n_large + left_bins[t]
    return items, bins, n_large + n_left_bins


def pack_mffd(
    lengths: np.ndarray, capacity: int, max_items: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """Returns (items in placement order, pack of each placement, number of packs)."""
    ordered, xs = decreasing_order(lengths, capacity, rng)
    return _mffd(ordered, xs, capacity, max_items, bins_hint(lengths, capacity, max_items))
