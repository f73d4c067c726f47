"""A hierarchical 64-ary bitset over 0..U-1 with next-set->=i and prev-set-<=i in O(log64 U).

Best fit keys open packs by remaining capacity (U = C + 1): "the fullest pack that still fits x"
is the next set bit >= x. Modified FFD keys remaining items by length: "the largest item that fits
in r" is the previous set bit <= r. For C = 4096 this is two levels, i.e. two word lookups.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


@njit(cache=True)
def _ctz(word: np.uint64) -> int:
    """Index of the lowest set bit (word != 0): one tzcnt instruction."""
    return int(trailing_zeros(word))  # type: ignore[call-arg]  # numba intrinsic, typed at compile time


@njit(cache=True)
def _clz(word: np.uint64) -> int:
    """Number of zero bits above the highest set bit (word != 0): one lzcnt instruction."""
    return int(leading_zeros(word))  # type: ignore[call-arg]  # numba intrinsic, typed at compile time


@njit(cache=True)
def new_bitset(universe: int) -> tuple[np.ndarray, np.ndarray]:
    """Empty bitset over 0..universe-1: (words of every level, level start offsets)."""
    sizes = []
    n = max(universe, 1)
    while True:
        n = (n + 63) // 64
        sizes.append(n)
        if n == 1:
            break
    offs = np.zeros(len(sizes) + 1, np.int64)
    for lv in range(len(sizes)):
        offs[lv + 1] = offs[lv] + sizes[lv]
    return np.zeros(offs[-1], np.uint64), offs


@njit(cache=True)
def bs_set(words: np.ndarray, offs: np.ndarray, i: int) -> None:
    """Set bit i (and the summary bits above it)."""
    for lv in range(offs.size - 1):
        w = offs[lv] + (i >> 6)
        before = words[w]
        words[w] = before | (_ONE << np.uint64(i & 63))
        if before != _ZERO:
            return
        i >>= 6


@njit(cache=True)
def bs_clear(words: np.ndarray, offs: np.ndarray, i: int) -> None:
    """Clear bit i (and summary bits whose word became empty)."""
    for lv in range(offs.size - 1):
        w = offs[lv] + (i >> 6)
        after = words[w] & ~(_ONE << np.uint64(i & 63))
        words[w] = after
        if after != _ZERO:
            return
        i >>= 6


@njit(cache=True)
def bs_next(words: np.ndarray, offs: np.ndarray, i: int) -> int:
    """Smallest set index >= i, or -1."""
    n_levels = offs.size - 1
    lv = 0
    while True:
        wi = i >> 6
        if wi >= offs[lv + 1] - offs[lv]:
            return -1
        m = words[offs[lv] + wi] & (_ALL << np.uint64(i & 63))
        if m != _ZERO:
            i = (wi << 6) + _ctz(m)
            break
        lv += 1
        if lv == n_levels:
            return -1
        i = wi + 1
    while lv > 0:
        lv -= 1
        i = (i << 6) + _ctz(words[offs[lv] + i])
    return i


@njit(cache=True)
def bs_prev(words: np.ndarray, offs: np.ndarray, i: int) -> int:
    """Largest set index <= i, or -1."""
    n_levels = offs.size - 1
    if i < 0:
        return -1
    top = (offs[1] - offs[0]) * 64 - 1
    if i > top:
        i = top
    lv = 0
    while True:
        wi = i >> 6
        m = words[offs[lv] + wi] & (_ALL >> np.uint64(63 - (i & 63)))
        if m != _ZERO:
            i = (wi << 6) + 63 - _clz(m)
            break
        lv += 1
        if lv == n_levels or wi == 0:
            return -1
        i = wi - 1
    while lv > 0:
        lv -= 1
        i = (i << 6) + 63 - _clz(words[offs[lv] + i])
    return i
