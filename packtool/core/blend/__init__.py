"""The torch-free half of a load-time blend of pack stores: counts, store orders, the interleave.

`packtool.loader.BlendedDataset` (items) and `packtool stats STORE:W ...` (the report) share it; the
loader's module docstring describes the order in full. Everything is computed on the fly from O(stores)
numbers, never from an array of samples.

- `counts.py`: `STORE:W` sources and their weights parsed; each store's samples per epoch (`sample_counts`).
- `keys.py`: the seeded 64-bit keys (`mix_int`, `mix_rows`) and each store's order (`permute`, a Feistel bijection).
- `interleave.py`: `Interleave`, the Huffman-tree interleave of the stores (prefix-balanced, seeded per epoch).
- `plan.py`: `BlendPlan`, the stores read from their metadata lines, fingerprint and schedule (`index`, `locate`).
"""

from __future__ import annotations

from packtool.core.blend.counts import parse_source, sample_counts
from packtool.core.blend.interleave import MAX_SAMPLES, Interleave
from packtool.core.blend.keys import mix_int, mix_rows, permute
from packtool.core.blend.plan import DEFAULT_MAX_OPEN, BlendPlan, default_max_open

__all__ = [
    "DEFAULT_MAX_OPEN",
    "MAX_SAMPLES",
    "BlendPlan",
    "Interleave",
    "default_max_open",
    "mix_int",
    "mix_rows",
    "parse_source",
    "permute",
    "sample_counts",
]
