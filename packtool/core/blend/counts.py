"""A blend's weights and counts: `STORE:W` sources parsed, and each store's samples per epoch by
`core.mixture`'s exact rules (k full passes over its packs, then `floor(f·n + 1/2)` distinct ones)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from packtool.core.blend.interleave import MAX_SAMPLES
from packtool.core.mixture import check_share, check_weight, fractional_count, split_weight, weight_of
from packtool.errors import ConfigError, UsageError

_FIX = "BlendedDataset, write STORE:2 (twice), STORE:0.5 (a seeded half) or drop the store"


def parse_source(spec: Any) -> tuple[str, float]:
    """`(path, weight)` from `"STORE:W"`, `"STORE"` (weight 1) or a `(store, weight)` pair.

    `STORE:W` is split and read as `packtool pack` reads it (`core.mixture.split_weight`, `weight_of`): `W` is
    written as the command line writes numbers (`2`, `0.5`, `1e6`), and `A:1,5` or `A:1_0` with A existing is a
    bad weight of A, not a missing store. A pair's weight is a number, or a string read the same way."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ConfigError(
                f"blend source {spec!r} is not a (store, weight) pair, BlendedDataset, pass [(store, weight), ...]"
            )
        path, weight = spec
        where = str(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else repr(path)
        if isinstance(weight, str):
            return where, weight_of(weight, where, "blend weight", _FIX)
        if isinstance(weight, np.floating):  # a float32 0.7 is the weight written 0.7, not 0.699999988
            weight = float(str(weight))
        elif isinstance(weight, np.integer):
            weight = int(weight)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise UsageError(f"blend weight {weight!r} of {where} is not a number, {_FIX}")
        check_weight(weight, where, "blend weight", _FIX)
        return where, float(weight)
    if isinstance(spec, (str, os.PathLike)):
        text = str(os.fspath(spec))
        path, weight_text = split_weight(text)
        if weight_text is None:
            return text, 1.0
        return path, weight_of(weight_text, path, "blend weight", _FIX)
    raise ConfigError(f"blend source {spec!r} is not STORE:W or (store, weight), BlendedDataset, pass e.g. 'web:0.5'")


def sample_counts(
    weights: Sequence[float], n_packs: Sequence[int], paths: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """`(full passes, partial, total)`: each store's whole passes over its packs and the distinct packs of its
    partial pass (`k·n + floor(f·n + 1/2)` samples), and the samples of one epoch of the blend. A store of
    packs whose weight gives it none (`STORE:1e-9`) is refused, saying what the weight rounds to."""
    for i, (w, n) in enumerate(zip(weights, n_packs, strict=True)):
        check_share(w, int(n), str(paths[i]) if paths is not None else f"source {i}", "blend weight", "pack")
    whole = {w: math.floor(Fraction(repr(w))) for w in set(weights)}  # core.mixture's exact rules
    passes = [whole[w] for w in weights]  # Python ints: a weight of 1e300 may not wrap
    partial = [fractional_count(w, n) if w != whole[w] else 0 for w, n in zip(weights, n_packs, strict=True)]
    total = sum(k * n + m for k, n, m in zip(passes, n_packs, partial, strict=True))
    if total == 0:
        raise ConfigError(
            "the blend has no samples (every store is empty or its weight rounds to 0 packs), BlendedDataset, raise a weight or add packs"
        )
    if total >= MAX_SAMPLES:
        raise ConfigError(
            f"the blend holds {total if total < 10**18 else f'{float(total):.3g}'} samples per epoch, over the exact limit 2**52, BlendedDataset, lower the weights"
        )
    full = np.array([min(k, MAX_SAMPLES) for k in passes], np.int64)  # (an empty store's k)
    return full, np.array(partial, np.int64), int(total)
