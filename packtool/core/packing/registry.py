"""The algorithm registry: name -> packer, one module per algorithm.

Every packer has the same narrow contract so that one dispatcher (`pack_lengths`) and one shared
test checker serve them all: `(lengths int64[n], capacity, max_items, rng) -> (items, bins, n_bins)`
where `items` lists item indices in placement order and `bins[t]` is the pack of `items[t]`
(packs numbered 0..n_bins-1, every number used).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from packtool.choices import Algorithm
from packtool.core.packing.bfd import pack_bfd
from packtool.core.packing.concat import pack_concat
from packtool.core.packing.ffd import pack_ffd
from packtool.core.packing.ffs import pack_ffs
from packtool.core.packing.mffd import pack_mffd

Packer = Callable[[np.ndarray, int, int, np.random.Generator], "tuple[np.ndarray, np.ndarray, int]"]

ALGORITHMS: dict[str, Packer] = {
    Algorithm.FFD.value: pack_ffd,
    Algorithm.BFD.value: pack_bfd,
    Algorithm.MFFD.value: pack_mffd,
    Algorithm.FFS.value: pack_ffs,
    Algorithm.CONCAT.value: pack_concat,
}
