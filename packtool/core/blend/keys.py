"""The blend's seeded keys and each store's order: splitmix64 mixing and a cycle-walked Feistel permutation.

`permute(j, n, key)` is a seeded bijection of `range(n)` evaluated pointwise, so a store's order over its packs
(and a huge plain dataset's shuffle, `PackedSampler`) is never stored.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_ROUNDS = 6
_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def mix_int(*parts: int) -> int:
    """A 64-bit key from a few non-negative integers (Python ints, order-sensitive)."""
    h = np.zeros(1, np.uint64)
    for p in parts:
        with np.errstate(over="ignore"):
            h = _mix(h ^ np.uint64((int(p) * _GOLDEN + 1) & _MASK64))
    return int(h[0])


def mix_rows(*columns: list[int]) -> np.ndarray:
    """`mix_int(*row)` for every row of the columns at once (uint64 array)."""
    h = np.zeros(len(columns[0]), np.uint64)
    for col in columns:
        h = _mix(h ^ np.array([(int(p) * _GOLDEN + 1) & _MASK64 for p in col], np.uint64))
    return h


def permute(j: np.ndarray, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """`π_key(j)` for each `j` in `range(n)`: a seeded bijection of `range(n)`, evaluated pointwise.

    `n` and `key` may be per-element arrays. A balanced Feistel network of `_ROUNDS` rounds on `2h` bits
    (`2**(2h) >= n`, the smallest even bit count), cycle-walked: values that land at or beyond `n` are
    enciphered again until they fall inside (fewer than 4 rounds of walking on average).
    """
    j = np.asarray(j, np.int64)
    nn = np.broadcast_to(np.asarray(n, np.int64), j.shape)
    keys = np.broadcast_to(np.asarray(key, np.uint64), j.shape)
    if j.size and (np.any(j < 0) or np.any(j >= nn)):
        raise IndexError("permute: an index is outside range(n)")
    bits = np.ceil(np.log2(np.maximum(nn, 2).astype(np.float64))).astype(np.int64)
    half = ((bits + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    round_keys = [_mix(keys ^ np.uint64((r + 1) * _GOLDEN & _MASK64)) for r in range(_ROUNDS)]
    out = j.astype(np.uint64)
    todo = np.flatnonzero(nn > 1)
    while todo.size:
        x = out[todo]
        h, m = half[todo], mask[todo]
        left, right = x >> h, x & m
        for rk in round_keys:
            left, right = right, left ^ (_mix(right ^ rk[todo]) & m)
        x = (left << h) | right
        out[todo] = x
        todo = todo[x >= nn[todo].astype(np.uint64)]
    return out.astype(np.int64)
