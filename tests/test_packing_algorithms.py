"""Every packing algorithm through one shared invariant checker, plus worked examples and quality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import packtool
from packtool.choices import Algorithm
from packtool.core.packing import ALGORITHMS, lower_bound, pack_lengths
from packtool.errors import ConfigError

ALL = sorted(ALGORITHMS)
DECREASING = ["ffd", "bfd", "mffd"]


def check_packing(lengths: np.ndarray, capacity: int, offsets: np.ndarray, order: np.ndarray,
                  max_items: int | None = None) -> int:
    """The contract every algorithm must meet; returns the number of packs."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert offsets.dtype == np.int64 and order.dtype == np.int64
    assert offsets.ndim == 1 and order.ndim == 1
    assert offsets[0] == 0 and offsets[-1] == lengths.size
    sizes = np.diff(offsets)
    assert (sizes >= 1).all(), "empty pack"
    assert np.array_equal(np.sort(order), np.arange(lengths.size)), "an item is missing or repeated"
    n_packs = offsets.size - 1
    if lengths.size:
        totals = np.add.reduceat(lengths[order], offsets[:-1])
        assert (totals <= capacity).all(), f"pack over capacity: {totals.max()} > {capacity}"
    if max_items is not None:
        assert (sizes <= max_items).all(), "more items in a pack than max_items_per_pack"
    assert n_packs >= lower_bound(lengths, capacity, max_items)
    return n_packs


def contents(lengths: list[int], capacity: int, algorithm: str) -> list[list[int]]:
    """Packs as lists of lengths (descending) in the algorithm's own pack order."""
    offsets, order = pack_lengths(np.array(lengths), capacity, algorithm, shuffle=False)
    arr = np.array(lengths)[order]
    return [sorted(arr[offsets[p]:offsets[p + 1]].tolist(), reverse=True) for p in range(offsets.size - 1)]


@st.composite
def instances(draw: st.DrawFn) -> tuple[np.ndarray, int, int | None, int]:
    capacity = draw(st.integers(1, 64))
    lengths = draw(st.lists(st.integers(0, capacity), max_size=120))
    k = draw(st.one_of(st.none(), st.integers(1, 6)))
    seed = draw(st.integers(0, 2**32))
    return np.array(lengths, dtype=np.int64), capacity, k, seed


@pytest.mark.parametrize("algorithm", ALL)
@settings(max_examples=60, deadline=None)
@given(inst=instances())
def test_invariants_hold_for_every_algorithm(algorithm: str, inst: tuple) -> None:
    lengths, capacity, k, seed = inst
    offsets, order = pack_lengths(lengths, capacity, algorithm, seed=seed, max_items_per_pack=k)
    check_packing(lengths, capacity, offsets, order, k)
    again = pack_lengths(lengths, capacity, algorithm, seed=seed, max_items_per_pack=k)
    assert np.array_equal(offsets, again[0]) and np.array_equal(order, again[1]), "not deterministic"
    other = pack_lengths(lengths, capacity, algorithm, seed=seed + 1, max_items_per_pack=k, shuffle=False)
    check_packing(lengths, capacity, *other, k)


@pytest.mark.parametrize("algorithm", ALL)
def test_edge_shapes(algorithm: str) -> None:
    offsets, order = pack_lengths(np.array([], dtype=np.int64), 8, algorithm)
    assert offsets.tolist() == [0] and order.size == 0
    zeros = np.zeros(50, np.int64)
    assert check_packing(zeros, 8, *pack_lengths(zeros, 8, algorithm)) == 1
    assert check_packing(zeros, 8, *pack_lengths(zeros, 8, algorithm, max_items_per_pack=7), 7) == 8
    full = np.full(9, 8, np.int64)
    assert check_packing(full, 8, *pack_lengths(full, 8, algorithm)) == 9
    mixed = np.array([8, 0, 3, 0, 5, 8, 0], np.int64)
    check_packing(mixed, 8, *pack_lengths(mixed, 8, algorithm))


@pytest.mark.parametrize("algorithm", ALL)
def test_realistic_long_tail_with_max_items(algorithm: str) -> None:
    rng = np.random.default_rng(7)
    lengths = np.clip(rng.lognormal(5, 1.5, 20_000).astype(np.int64), 0, 2048)
    for k in (None, 1, 4, 16):
        check_packing(lengths, 2048, *pack_lengths(lengths, 2048, algorithm, seed=3, max_items_per_pack=k), k)


def test_seeds_change_the_result_but_not_its_validity() -> None:
    lengths = np.random.default_rng(0).integers(1, 100, 500)
    for algorithm in ["ffd", "bfd", "mffd", "ffs"]:
        results = {pack_lengths(lengths, 256, algorithm, seed=s)[1].tobytes() for s in range(4)}
        assert len(results) > 1, f"{algorithm}: the seed has no effect"


def test_worked_example_ffd_and_bfd_differ() -> None:
    # C = 20, items 16, 13, 6, 1. Both open [16] (room 4) and [13] (room 7); 6 only fits with 13.
    # The 1 then goes to the FIRST pack with room (16's, room 4) under FFD, to the FULLEST pack
    # that fits (13+6, room 1) under BFD.
    assert contents([6, 16, 1, 13], 20, "ffd") == [[16, 1], [13, 6]]
    assert contents([6, 16, 1, 13], 20, "bfd") == [[16], [13, 6, 1]]
    # A textbook FFD instance: C = 10 fills three packs exactly.
    assert contents([2, 5, 4, 7, 1, 3, 8], 10, "ffd") == [[8, 2], [7, 3], [5, 4, 1]]


def test_worked_example_mffd_phases() -> None:
    # C = 60: large > 30, medium (20, 30], small (10, 20]. 38 opens a pack (room 22); it gets no
    # medium, so phase 3 adds the two smallest smalls 11 + 11 = 22 exactly; 13 goes to a new pack.
    # FFD instead puts 13 first next to 38 and leaves 11 + 11 alone.
    assert contents([11, 38, 13, 11], 60, "mffd") == [[38, 11, 11], [13]]
    assert contents([11, 38, 13, 11], 60, "ffd") == [[38, 13], [11, 11]]
    # Phase 2 gives 35 (room 25) the medium 22; phase 4 fills 40 (room 20) with 12 then 5;
    # phase 5 packs the leftovers 21, 11, 10 by FFD.
    assert contents([40, 35, 22, 21, 12, 11, 10, 5], 60, "mffd") == [[40, 12, 5], [35, 22], [21, 11, 10]]


def test_concat_keeps_document_order() -> None:
    offsets, order = pack_lengths(np.array([4, 1, 3, 2, 1, 3, 4, 5]), 5, "concat", shuffle=False)
    assert order.tolist() == list(range(8))
    assert offsets.tolist() == [0, 2, 4, 6, 7, 8]
    offsets, _ = pack_lengths(np.array([1, 1, 1, 1, 1]), 5, "concat", shuffle=False, max_items_per_pack=2)
    assert offsets.tolist() == [0, 2, 4, 5]


def _pack_index_length_correlation(shuffle: bool) -> float:
    lengths = np.clip(np.random.default_rng(1).lognormal(6, 1, 20_000).astype(np.int64), 1, 4096)
    offsets, order = pack_lengths(lengths, 4096, "ffd", seed=0, shuffle=shuffle)
    sizes = np.diff(offsets)
    mean_len = np.add.reduceat(lengths[order], offsets[:-1]) / sizes
    return float(np.corrcoef(np.arange(sizes.size), mean_len)[0, 1])


def test_pack_order_shuffle_removes_length_correlation() -> None:
    assert abs(_pack_index_length_correlation(shuffle=False)) > 0.5
    assert abs(_pack_index_length_correlation(shuffle=True)) < 0.1


@pytest.mark.parametrize("algorithm", DECREASING)
@pytest.mark.parametrize("shape", ["lognormal", "zipf"])
def test_decreasing_algorithms_reach_the_lower_bound(algorithm: str, shape: str) -> None:
    rng = np.random.default_rng(11)
    if shape == "lognormal":
        lengths = np.clip(rng.lognormal(6, 1, 100_000).astype(np.int64), 1, 4096)
    else:
        lengths = np.minimum(rng.zipf(1.3, 100_000), 4096).astype(np.int64)
    n_packs = check_packing(lengths, 4096, *pack_lengths(lengths, 4096, algorithm))
    assert n_packs <= int(np.ceil(lower_bound(lengths, 4096) * 1.0001)) + 1


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", DECREASING)
def test_decreasing_algorithms_reach_the_lower_bound_at_1m(algorithm: str) -> None:
    lengths = np.clip(np.random.default_rng(5).lognormal(6, 1, 1_000_000).astype(np.int64), 1, 4096)
    n_packs = check_packing(lengths, 4096, *pack_lengths(lengths, 4096, algorithm))
    assert n_packs <= lower_bound(lengths, 4096) * 1.0001


def test_lower_bound() -> None:
    assert lower_bound(np.array([], np.int64), 10) == 0
    assert lower_bound(np.zeros(3, np.int64), 10) == 1
    assert lower_bound(np.array([10, 10, 1]), 10) == 3
    assert lower_bound(np.ones(10, np.int64), 100, max_items_per_pack=3) == 4


def test_public_name_and_enum() -> None:
    offsets, order = packtool.pack_lengths(np.array([3, 3, 3]), 6, algorithm=Algorithm.BFD, seed=0)
    check_packing(np.array([3, 3, 3]), 6, offsets, order)
    assert set(ALGORITHMS) == {a.value for a in Algorithm}


@pytest.mark.parametrize(
    ("lengths", "capacity", "kwargs", "match"),
    [
        ([1, 2, 9, 3, 10], 8, {}, "item 2 has length 9"),
        ([1, -1], 8, {}, "index 1"),
        ([1.5, 2.0], 8, {}, "integers"),
        ([[1, 2]], 8, {}, "1-D"),
        ([1, 2], 0, {}, "positive integer"),
        ([1, 2], 1 << 40, {}, "supported maximum"),
        ([1, 2], 8, {"max_items_per_pack": 0}, "max items per pack"),
        ([1, 2], 8, {"algorithm": "worst-fit"}, "unknown packing algorithm"),
    ],
)
def test_invalid_input_raises_config_error(lengths: list, capacity: int, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        pack_lengths(np.array(lengths), capacity, **kwargs)


@pytest.mark.parametrize("algorithm", ALL)
def test_a_cap_above_the_item_count_is_no_cap(algorithm: str) -> None:
    """`--max-docs-per-pack 10**24` overflowed the compiled packers' int64; a cap >= n binds nothing."""
    lengths = np.random.default_rng(3).integers(1, 300, 500)
    free = pack_lengths(lengths, 512, algorithm=algorithm, seed=1)
    for cap in (500, 501, 2**63, 10**24):
        got = pack_lengths(lengths, 512, algorithm=algorithm, seed=1, max_items_per_pack=cap)
        assert all(np.array_equal(a, b) for a, b in zip(got, free, strict=True))
