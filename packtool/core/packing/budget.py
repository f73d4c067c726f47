"""Packing under two capacities: tokens per pack (N) and vision-encoder patches per pack (the budget).

Every registered algorithm serves, unchanged: `pack_with_budget` first packs the token lengths exactly
as `pack_lengths` does (same seed, same random stream). Where no pack holds more than `budget` patches
the budget does not bind and the result IS `pack_lengths`' result, byte for byte. Where some packs
exceed it, two candidates are built with the same algorithm and the one with fewer packs is kept:
(a) every item packed on a scalar size that implies both capacities, `max(length, ceil(patches * N /
budget))` (packs whose sizes sum to at most N hold at most N tokens and at most `budget` patches);
(b) the token packing repaired: each pack over the budget gives up its most patch-heavy items until it
fits, and those are packed on the scalar size. (a) wins when many packs are over the budget (+3.5%
packs over the bound where (b) gave +17%, scripts/bench_vision.py pack), (b) when few are. Every pack
respects both capacities, and `max_items` too.
"""

from __future__ import annotations

import numpy as np

from packtool.choices import Algorithm
from packtool.core.packing import ALGORITHMS, _group, _validate, lower_bound
from packtool.errors import ConfigError


def budget_lower_bound(
    lengths: np.ndarray, patches: np.ndarray, capacity: int, budget: int | None, max_items_per_pack: int | None = None
) -> int:
    """Fewest packs under both capacities: the token bound and ceil(total patches / budget)."""
    bound = lower_bound(lengths, capacity, max_items_per_pack)
    if budget is None or not np.asarray(patches).size:
        return bound
    return max(bound, -(-int(np.asarray(patches, np.int64).sum()) // int(budget)))


def pack_with_budget(
    lengths: np.ndarray,
    patches: np.ndarray,
    capacity: int,
    budget: int | None,
    algorithm: str | Algorithm = Algorithm.BFD,
    seed: int = 0,
    shuffle: bool = True,
    max_items_per_pack: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`pack_lengths` with a second capacity: at most `budget` patches per pack (None: no budget).

    Returns `(pack_offsets, order)` as `pack_lengths` does; equal to it whenever the budget does not bind."""
    name = str(algorithm)
    packer = ALGORITHMS.get(name)
    if packer is None:
        raise ConfigError(f"unknown packing algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    arr = _validate(lengths, capacity, max_items_per_pack)
    n = arr.size
    pat = np.ascontiguousarray(patches, dtype=np.int64)
    if pat.shape != arr.shape or (n and int(pat.min()) < 0):
        raise ConfigError(f"patches must be {n} integers >= 0 (one per item), got shape {pat.shape}")
    if budget is not None and n and int(pat.max()) > budget:
        i = int(np.argmax(pat > budget))
        raise ConfigError(
            f"item {i} has {int(pat[i])} vision patches, over the budget {budget}; "
            "drop it or split it first (packtool pack --overlong split|drop)"
        )
    if n == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int64)
    max_items = n + 1 if max_items_per_pack is None else min(int(max_items_per_pack), n + 1)
    rng = np.random.default_rng(seed)
    items, bins, n_bins = packer(arr, int(capacity), max_items, rng)
    if budget is not None and _binds(items, bins, n_bins, pat, int(budget)):
        repaired = _repair(items, bins, n_bins, arr, pat, int(capacity), int(budget), max_items, packer, rng)
        scalar_rng = np.random.default_rng(seed)
        scalar = packer(_scalar(arr, pat, int(capacity), int(budget)), int(capacity), max_items, scalar_rng)
        # the fewer packs (scalar sizes on a tie): both respect both capacities
        items, bins, n_bins = repaired if repaired[2] < scalar[2] else scalar
        rng = rng if repaired[2] < scalar[2] else scalar_rng
    rank = rng.permutation(n_bins) if shuffle else np.arange(n_bins)
    return _group(items, bins, rank.astype(np.int64, copy=False))


def _binds(items: np.ndarray, bins: np.ndarray, n_bins: int, patches: np.ndarray, budget: int) -> bool:
    """Whether some pack of the token-only packing holds more than `budget` patches."""
    per_bin = np.bincount(np.asarray(bins, np.int64), weights=patches[np.asarray(items, np.int64)], minlength=n_bins)
    return bool(np.any(per_bin > budget))


def _scalar(lengths: np.ndarray, patches: np.ndarray, capacity: int, budget: int) -> np.ndarray:
    """One size that implies both capacities: packs of total <= N hold <= N tokens and <= budget patches."""
    return np.ascontiguousarray(np.maximum(lengths, -(-patches * capacity // budget)), dtype=np.int64)


def _repair(items, bins, n_bins, lengths, patches, capacity, budget, max_items, packer, rng):  # type: ignore[no-untyped-def]
    """Packs over the budget give up their most patch-heavy items; those are packed again on the scalar size."""
    items = np.asarray(items, np.int64)
    bins = np.asarray(bins, np.int64)
    p = patches[items]
    per_bin = np.bincount(bins, weights=p, minlength=n_bins).astype(np.int64)
    order = np.lexsort((-p, bins))  # by pack, heaviest first
    sorted_bins, sorted_p = bins[order], p[order]
    first = np.searchsorted(sorted_bins, sorted_bins, side="left")
    before = np.cumsum(sorted_p) - sorted_p  # patches of heavier items in the same pack, given up before this one
    before -= (np.cumsum(sorted_p) - sorted_p)[first]
    excess = per_bin[sorted_bins] - budget
    evict = np.zeros(items.size, bool)
    evict[order] = before < excess  # give up items until the pack's remaining patches fit
    keep_items, keep_bins = items[~evict], bins[~evict]
    rest = items[evict]
    more_items, more_bins, more = packer(
        _scalar(lengths[rest], patches[rest], capacity, budget), capacity, max_items, rng
    )
    return (
        np.concatenate([keep_items, rest[np.asarray(more_items, np.int64)]]),
        np.concatenate([keep_bins, np.asarray(more_bins, np.int64) + n_bins]),
        n_bins + int(more),
    )
