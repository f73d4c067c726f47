"""Mixtures and the validation split: which documents each split of a pack holds, how often.

Pure functions, arrays in -> arrays out; the pack stage feeds them token stores, verify feeds
them the same stores to re-derive what the packs must hold.

- **Weights count epochs.** A store of n documents with weight `w = k + f` (k integer, 0 <= f < 1)
  contributes every document k times plus `round(f * n)` distinct documents (half rounded up,
  i.e. `floor(f * n + 1/2)`) drawn without replacement by a generator seeded with the pack seed,
  the store's manifest sha256 and how many times that store appeared before in the mixture.
  Occurrence counts are therefore exact: k or k + 1 per document, and the same for a seed.
- **Validation by content.** A document's 64-bit hash is computed over its token VALUES
  (each widened to 64 bits, so uint16 and uint32 stores agree) and its length; the document is a
  validation document when `hash < F * 2**64`. Token-identical documents never straddle the two
  splits, and a document's split depends on nothing else (not its store, position or neighbours),
  so adding or removing a store moves no document. Validation is taken BEFORE repetition: a
  held-out document is never in training, and validation holds it once per occurrence in the
  un-repeated stores, whatever the store's weight.

The hash is one compiled pass over the tokens: ~600M tokens/s on one core (1.6 ns per token, uint32,
50M tokens, measured on the shared 2-core dev machine), a read pass next to the copy packing does anyway.
"""

from __future__ import annotations

import math
import os
import re
from fractions import Fraction

import numpy as np
from numba import njit

from packtool.errors import UsageError

#: the name of the content hash, recorded in the metadata: a change of the function is a new name
CONTENT_HASH = "packtool-content-v1"

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_P = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime
_BASIS = np.uint64(0xCBF29CE484222325)  # FNV-1a 64-bit offset basis
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(nogil=True, cache=True)
def _content_hashes(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> None:
    """FNV-1a over 64-bit token values, then the splitmix64 finaliser over (hash, length)."""
    for i in range(starts.size):
        h = _BASIS
        s = starts[i]
        for j in range(s, s + lengths[i]):
            h = (h ^ np.uint64(tokens[j])) * _P
        h ^= np.uint64(lengths[i]) * _GOLDEN
        h = (h ^ (h >> _S30)) * _M1
        h = (h ^ (h >> _S27)) * _M2
        out[i] = h ^ (h >> _S31)


def content_hashes(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint64 hash of each document `tokens[starts[i] : starts[i] + lengths[i]]` (dtype-independent)."""
    out = np.empty(np.asarray(starts).size, np.uint64)
    _content_hashes(tokens, np.asarray(starts, np.int64), np.asarray(lengths, np.int64), out)
    return out


def validation_threshold(fraction: float) -> np.uint64:
    """Documents whose hash is below this go to validation: `floor(F * 2**64)`, kept below 2**64."""
    check_fraction(fraction)
    return np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))


def check_fraction(fraction: float) -> None:
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise UsageError(
            f"--validation must be a fraction of documents strictly between 0 and 1, got {fraction!r}, pass e.g. 0.01"
        )


#: a weight as the command line writes numbers: ASCII decimal or exponent notation (`2`, `0.5`, `.5`, `1e6`)
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NOT_FINITE = re.compile(r"[-+]?(?:inf|infinity|nan)", re.IGNORECASE)  # numbers, refused as not finite
WEIGHT_FIX = "write STORE:2 (twice), STORE:0.5 (a seeded half) or leave the weight out for 1"


def read_number(text: str) -> float | None:
    """The number a weight's text writes (`2`, `0.5`, `.5`, `1e6`, `1E-3`, and `inf`/`nan`, which `check_weight`
    then refuses), or None: Python's other number syntax (`1_0`, `0x10`, spaces, digits of other scripts) and
    `1,5` are not weights, whatever `float()` makes of them."""
    if _DECIMAL.fullmatch(text) or _NOT_FINITE.fullmatch(text):
        return float(text)
    return None


def split_weight(spec: str) -> tuple[str, str | None]:
    """`PATH[:WEIGHT]` -> `(path, the weight's text or None)`, the one rule of `pack`, `stats` and `BlendedDataset`.

    Only what follows the last colon can be a weight (paths may hold colons). A whole spec that names an
    existing path, when the part before the colon does not, is a path. Otherwise the tail is a weight when it
    reads as a number, or when the part before the colon exists (then `weight_of` refuses the tail by name:
    `A:1,5` is a bad weight of A, not a missing store `A:1,5`)."""
    path, colon, tail = spec.rpartition(":")
    if not colon or not path:
        return spec, None
    if os.path.exists(spec) and not os.path.exists(path):
        return spec, None
    if read_number(tail) is not None or os.path.exists(path):
        return path, tail
    return spec, None


def weight_of(text: str, where: str, noun: str = "mixture weight", fix: str = WEIGHT_FIX) -> float:
    """The weight `text` of store `where` as a float, or a UsageError naming it (not a number, not finite, <= 0)."""
    value = read_number(text)
    if value is None:
        raise UsageError(f"{noun} {text!r} of {where} is not a number, {fix}")
    check_weight(value, where, noun, fix, shown=text)
    return value


def check_weight(
    weight: float, where: str, noun: str = "mixture weight", fix: str = WEIGHT_FIX, shown: str | None = None
) -> None:
    """Refuse a weight that is no finite number > 0 (named as `shown`, the text as written, else its repr)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not (math.isfinite(weight) and weight > 0):
        text = repr(weight) if shown is None else shown
        raise UsageError(f"{noun} {text} of {where} must be a finite number > 0 (epochs of that store), {fix}")


def check_share(weight: float, n: int, where: str, noun: str = "mixture weight", unit: str = "document") -> None:
    """Refuse a weight that gives a store of `n > 0` items none at all: its fraction of the items rounds to 0.

    Weight 0 is refused as such; a weight of 1e-9 gave 0 items silently. The message says what the weight
    rounds to and the least weight that gives one item (half an item: `1 / (2n)`, rounded up)."""
    if n > 0 and repeated_count(weight, n) == 0:
        least = Fraction(1, 2 * n)
        digits = 2 - math.floor(math.log10(least))  # three significant digits, rounded up
        shown = float(Fraction(math.ceil(least * 10**digits), 10**digits))
        raise UsageError(
            f"{noun} {weight!r} of {where} gives it 0 of its {n} {unit}s ({weight!r} x {n} = {weight * n:.3g} "
            f"rounds to 0), raise it to at least {shown!r} (half a {unit}) or drop the store"
        )


def fractional_count(weight: float, n: int) -> int:
    """Documents the fractional part f of `weight` adds: `round(f * n)`, halves rounded up, in exact decimal
    arithmetic on the weight as written (1.15 and 2.15 add the same count; float `weight - 1` is 0.1499...)."""
    exact = Fraction(repr(float(weight)))
    return min(n, math.floor((exact - math.floor(exact)) * n + Fraction(1, 2)))


def repeated_count(weight: float, n: int) -> int:
    """How many documents `repeat_documents` returns for `n` eligible ones: k·n + round(f·n), exact."""
    return math.floor(Fraction(repr(float(weight)))) * n + fractional_count(weight, n)


def repeat_documents(eligible: np.ndarray, weight: float, seed: int, store_key: str, repeat: int = 0) -> np.ndarray:
    """Local document indices of one store in one split: `eligible` k times, then a seeded subset.

    `store_key` (the store's manifest sha256) and `repeat` (how often the same store came before in
    the mixture) make the subset a function of the store and the seed, not of its position.
    """
    eligible = np.asarray(eligible, np.int64)
    k = int(math.floor(weight))
    m = fractional_count(weight, int(eligible.size))
    parts = [eligible] * k
    if m:
        key = int(store_key[:16], 16) if store_key else 0
        rng = np.random.default_rng([int(seed), key, int(repeat)])
        parts.append(np.sort(rng.choice(eligible, size=m, replace=False)))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
