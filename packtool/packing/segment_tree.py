"""First fit in O(log B) per item: a max segment tree over the bins' remaining capacities.

Leaves are bins in opening order; a not-yet-opened bin holds the full capacity, so "leftmost
leaf with remaining >= x" is exactly first fit, and it opens a new bin when nothing open fits.
A bin that reached `max_items` items gets remaining -1, so not even a zero-length item fits.
The tree starts at a size estimated from the lower bound and doubles when every leaf is open.
Values only decrease, so an update stops climbing as soon as a parent's max is unchanged.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _new_tree(n_leaves: int, capacity: int) -> np.ndarray:
    """Tree of 2*P nodes (P a power of two >= n_leaves), every leaf a fresh bin."""
    size = 1
    while size < n_leaves:
        size *= 2
    return np.full(2 * size, capacity, np.int64)


@njit(cache=True)
def _grow(tree: np.ndarray, capacity: int) -> np.ndarray:
    """Double the number of leaves, keeping the existing bins' remaining capacities."""
    old = tree.size // 2
    new = np.full(4 * old, capacity, np.int64)
    new[2 * old:3 * old] = tree[old:]
    for i in range(2 * old - 1, 0, -1):
        new[i] = max(new[2 * i], new[2 * i + 1])
    return new


@njit(cache=True)
def _leftmost_fit(tree: np.ndarray, x: int) -> int:
    """Index of the leftmost leaf whose value is >= x (caller checks tree[1] >= x)."""
    half = tree.size // 2
    i = 1
    while i < half:
        i *= 2
        if tree[i] < x:
            i += 1
    return i - half


@njit(cache=True)
def _set_leaf(tree: np.ndarray, leaf: int, value: int) -> None:
    """Lower one leaf's value and fix the maxima above it (values never increase)."""
    i = leaf + tree.size // 2
    tree[i] = value
    i >>= 1
    while i >= 1:
        m = max(tree[2 * i], tree[2 * i + 1])
        if tree[i] == m:
            break
        tree[i] = m
        i >>= 1


@njit(cache=True)
def first_fit(items: np.ndarray, lengths: np.ndarray, capacity: int, max_items: int,
              bins_hint: int) -> tuple[np.ndarray, int]:
    """Place `items` in the given order, each into the first bin it fits; returns (bin per item, n_bins)."""
    n = items.size
    tree = _new_tree(max(bins_hint, 1), capacity)
    counts = np.zeros(tree.size // 2, np.int64)
    bins = np.empty(n, np.int64)
    n_bins = 0
    for t in range(n):
        x = lengths[items[t]]
        if tree[1] < x:
            tree = _grow(tree, capacity)
            grown = np.zeros(tree.size // 2, np.int64)
            grown[:counts.size] = counts
            counts = grown
        b = _leftmost_fit(tree, x)
        bins[t] = b
        if b >= n_bins:
            n_bins = b + 1
        counts[b] += 1
        rem = tree[b + tree.size // 2] - x
        if counts[b] >= max_items:
            rem = -1
        _set_leaf(tree, b, rem)
    return bins, n_bins
