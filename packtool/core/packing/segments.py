"""Documents -> segments: the items a packing algorithm places.

A segment is a run of a document's tokens plus optional `--pad-multiple` padding at its end.
A document no longer than the usable capacity is one segment. A longer one is cut, dropped or
refused by the `--overlong` policy; with `split` it becomes fragments of at most `cap` tokens,
in order, so `verify --source` can reassemble it from `seg_doc`/`seg_src`.

The usable capacity is N rounded DOWN to the pad multiple M (padding counts against the size,
so a fragment of `cap` tokens padded up to M never exceeds N). Zero-length documents produce
no segment: an empty segment would add a zero-length entry to `cu_seqlens` that flash-attn and
Megatron treat as an edge case, and it carries no training signal. They are counted instead
(`n_empty_documents` in the metadata) so `verify --source` can account for them.

Everything is vectorised over documents (np.repeat/cumsum), never a per-document Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.choices import Overlong
from packtool.errors import ConfigError


@dataclass(frozen=True)
class Segments:
    """Segments in DOCUMENT order (fragments of a document consecutive, in order)."""

    doc: np.ndarray  # int64: source document index
    src: np.ndarray  # int64: start offset of the segment's tokens in tokens.bin
    real: np.ndarray  # int64: how many real tokens the segment holds
    pad: np.ndarray  # int64: --pad-multiple pad tokens appended after them
    n_overlong: int  # documents longer than the usable capacity (whatever the policy did)
    n_empty: int  # zero-length documents (no segment)
    n_dropped_tokens: int  # tokens not packed: truncated tails and dropped documents

    @property
    def lengths(self) -> np.ndarray:
        """Length of every segment as packed: real tokens + padding (int64)."""
        return self.real + self.pad

    def __len__(self) -> int:
        return int(self.doc.size)


def usable_capacity(size: int, pad_multiple: int) -> int:
    """Longest run of real tokens one segment may hold: N rounded down to a multiple of M."""
    if size < 1:
        raise ConfigError(f"--size must be a positive number of tokens, got {size}, pass e.g. --size 4096")
    if pad_multiple < 1:
        raise ConfigError(f"--pad-multiple must be >= 1, got {pad_multiple}, pass 1 to disable padding")
    cap = (size // pad_multiple) * pad_multiple
    if cap == 0:
        raise ConfigError(
            f"--pad-multiple {pad_multiple} is larger than --size {size}, no segment could fit, use a pad multiple <= the size"
        )
    return cap


def build_segments(
    starts: np.ndarray, lengths: np.ndarray, size: int, overlong: Overlong | str = Overlong.SPLIT, pad_multiple: int = 1
) -> Segments:
    """Turn documents (start offset, length) into segments that each fit a pack of `size`.

    `error` raises ConfigError naming the first over-long document, its length and the fixes.
    """
    policy = Overlong(overlong)
    cap = usable_capacity(size, pad_multiple)
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n_empty = int(np.count_nonzero(lengths == 0))
    long_mask = lengths > cap
    n_overlong = int(np.count_nonzero(long_mask))
    if n_overlong and policy is Overlong.ERROR:
        first = int(np.flatnonzero(long_mask)[0])
        raise ConfigError(
            f"document {first} has {int(lengths[first])} tokens, longer than the pack size {size}"
            + (f" (usable {cap} with --pad-multiple {pad_multiple})" if cap != size else "")
            + f" ({n_overlong} over-long documents in all), token store, "
            "use --overlong split|truncate|drop or a larger --size"
        )
    kept = lengths > 0
    dropped_tokens = 0
    if policy is Overlong.DROP:
        dropped_tokens = int(lengths[long_mask].sum())
        kept &= ~long_mask
    if policy is Overlong.SPLIT:
        n_frag = np.where(kept, -(-lengths // cap), 0)
        doc = np.repeat(np.arange(lengths.size, dtype=np.int64), n_frag)
        first_seg = np.cumsum(n_frag) - n_frag  # index of each document's first fragment
        frag_idx = np.arange(doc.size, dtype=np.int64) - np.repeat(first_seg, n_frag)
        src = starts[doc] + frag_idx * cap
        real = np.minimum(cap, lengths[doc] - frag_idx * cap)
    else:
        doc = np.flatnonzero(kept).astype(np.int64)
        src = starts[doc]
        real = np.minimum(lengths[doc], cap)
        if policy is Overlong.TRUNCATE:
            dropped_tokens = int((lengths[doc] - real).sum())
    pad = (-real) % pad_multiple
    return Segments(
        doc=doc,
        src=src,
        real=real,
        pad=pad.astype(np.int64),
        n_overlong=n_overlong,
        n_empty=n_empty,
        n_dropped_tokens=dropped_tokens,
    )


def expand_runs(lengths: np.ndarray, *starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Flat element indices of runs: for each start array, `start[i] + 0..lengths[i]-1`, concatenated.

    One np.repeat + arange per array instead of a Python loop over runs: verify uses it to compare
    packed segments with their source documents block by block.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    run_begin = np.cumsum(lengths) - lengths  # position of each run in the flat output
    ramp = np.arange(total, dtype=np.int64)
    return tuple(np.repeat(np.asarray(s, np.int64) - run_begin, lengths) + ramp for s in starts)
