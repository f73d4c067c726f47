"""A blend's weights and counts: `STORE:W` sources parsed, and each store's samples per epoch by
`core.mixture`'s exact rules (k full passes over its packs, then `floor(f·n + 1/2)` distinct ones)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.blend.interleave import MAX_SAMPLES
from packtool.core.mixture import fractional_count
from packtool.errors import ConfigError, UsageError


def parse_source(spec: Any) -> tuple[str, float]:
    """`(path, weight)` from `"STORE:W"`, `"STORE"` (weight 1) or a `(store, weight)` pair."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ConfigError(
                f"blend source {spec!r} is not a (store, weight) pair, BlendedDataset, pass [(store, weight), ...]"
            )
        path, weight = spec
        return str(os.fspath(path)), _check_weight(weight, str(path))
    if isinstance(spec, (str, os.PathLike)):
        text = str(os.fspath(spec))
        head, sep, tail = text.rpartition(":")
        if sep and head and not Path(text).exists():
            try:
                value = float(tail)
            except ValueError:
                value = None
            if value is not None:
                return head, _check_weight(value, head, tail)
        return text, 1.0
    raise ConfigError(f"blend source {spec!r} is not STORE:W or (store, weight), BlendedDataset, pass e.g. 'web:0.5'")


def _check_weight(weight: Any, where: str, text: str | None = None) -> float:
    shown = text if text is not None else repr(weight)
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)):
        raise UsageError(
            f"blend weight {shown} of {where} is not a number, BlendedDataset, write STORE:2 (twice) or STORE:0.5 (a seeded half)"
        )
    w = float(weight)
    if not math.isfinite(w) or w <= 0:
        raise UsageError(
            f"blend weight {shown} of {where} must be a finite number > 0 (epochs of that store), BlendedDataset, "
            "write STORE:2 (twice), STORE:0.5 (a seeded half) or drop the store"
        )
    return w


def sample_counts(weights: Sequence[float], n_packs: Sequence[int]) -> tuple[np.ndarray, np.ndarray, int]:
    """`(full passes, partial, total)`: each store's whole passes over its packs and the distinct packs of its
    partial pass (`k·n + floor(f·n + 1/2)` samples), and the samples of one epoch of the blend."""
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
