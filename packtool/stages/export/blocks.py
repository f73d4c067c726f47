"""Packs, a block at a time, as packtool's own loader sees them: the one truth every export is built from.

`PackedDataset` gives, per pack row of N tokens: unshifted labels that are targets where the token
store's loss says so, except each segment's first token, `--pad-multiple` padding and the tail
padding. `target` below is exactly `labels != -100` of that view, computed with whole-block numpy
(no per-token Python), so each exporter only re-expresses it in its trainer's convention and the
interop tests can compare the trainers' batches with the loader's for every pack.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.errors import FormatError
from packtool.formats.exports import ParquetRows, row_group_rows
from packtool.formats.pack_store import PackSplit
from packtool.progress import Progress

BLOCK_TOKENS = 1 << 22
"""Tokens per block of packs (~4M: a few tens of MB of temporaries whatever the store size)."""


@dataclass(frozen=True)
class PackBlock:
    """Packs `p0:p1` of a split: tokens, the loader's target mask, and where their segments sit."""

    p0: int
    p1: int
    tokens: np.ndarray  # [B, N] store dtype
    target: np.ndarray  # bool [B, N]: the loader's `labels != -100`
    counts: np.ndarray  # int64 [B]: segments per pack
    seg_start: np.ndarray  # int64 [n_seg]: column of each segment's first token in its pack
    seg_len: np.ndarray  # int64 [n_seg]: tokens per segment, --pad-multiple padding included
    seg_pad: np.ndarray  # int64 [n_seg]: of those, --pad-multiple padding (at the segment's end)
    used: np.ndarray  # int64 [B]: tokens before the tail padding

    @property
    def n_packs(self) -> int:
        return self.p1 - self.p0

    @property
    def size(self) -> int:
        return int(self.tokens.shape[1])

    def in_use(self) -> np.ndarray:
        """bool [B, N]: True before each pack's tail padding."""
        return np.arange(self.size)[None, :] < self.used[:, None]

    def seg_flat(self) -> np.ndarray:
        """Flat index (row * N + column) of each segment's first token in `tokens.ravel()`."""
        rows = np.repeat(np.arange(self.n_packs, dtype=np.int64), self.counts)
        return rows * self.size + self.seg_start


def packs_per_block(size: int) -> int:
    return max(1, BLOCK_TOKENS // max(1, size))


def iter_blocks(store: PackSplit, block_packs: int | None = None) -> Iterator[PackBlock]:
    """Yield the store's packs in order, `block_packs` at a time (default: ~4M tokens per block)."""
    n = store.size
    step = block_packs or packs_per_block(n)
    po = np.asarray(store.pack_offsets, dtype=np.int64)
    for p0 in range(0, store.n_packs, step):
        p1 = min(store.n_packs, p0 + step)
        yield _block(store, p0, p1, po)


def _block(store: PackSplit, p0: int, p1: int, po: np.ndarray) -> PackBlock:
    n = store.size
    s0, s1 = int(po[p0]), int(po[p1])
    lens = np.asarray(store.seg_lens[s0:s1], dtype=np.int64)
    pads = np.asarray(store.seg_pad[s0:s1], dtype=np.int64)
    counts = np.diff(po[p0 : p1 + 1])
    ends = np.cumsum(lens)
    pack_base = np.repeat(_pack_starts(ends, lens, counts), counts)
    seg_start = ends - lens - pack_base
    used = np.zeros(p1 - p0, dtype=np.int64)
    nonempty = counts > 0
    used[nonempty] = np.add.reduceat(lens, (po[p0:p1] - s0)[nonempty])
    if np.any(lens <= 0) or np.any(pads < 0) or np.any(pads >= lens) or np.any(used > n):
        raise FormatError(
            f"packs {p0}..{p1 - 1} have inconsistent segment lengths (empty segment, padding >= length or sum > {n}), {store.directory}, re-run `packtool pack`"
        )
    tokens = np.asarray(store.tokens[p0:p1])
    target = np.ones(tokens.shape, dtype=bool) if store.loss is None else np.asarray(store.loss[p0:p1]) != 0
    target &= np.arange(n)[None, :] < used[:, None]  # the tail padding
    rows = np.repeat(np.arange(p1 - p0, dtype=np.int64), counts)
    flat = target.reshape(-1)
    flat[rows * n + seg_start] = False  # a segment's first token is never a target
    if np.any(pads):  # --pad-multiple padding at each segment's end
        has = pads > 0
        pad_first = (rows * n + seg_start + lens - pads)[has]
        flat[np.repeat(pad_first, pads[has]) + _ramp(pads[has])] = False
    return PackBlock(p0, p1, tokens, target, counts, seg_start, lens, pads, used)


def _pack_starts(ends: np.ndarray, lens: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per pack, the running token total before its first segment (to rebase columns to 0)."""
    first = np.cumsum(counts) - counts  # index of each pack's first segment
    starts = np.zeros(counts.size, dtype=np.int64)
    has = counts > 0
    starts[has] = (ends - lens)[first[has]]
    return starts


def _ramp(lengths: np.ndarray) -> np.ndarray:
    """Concatenated `arange(l)` for every l in `lengths`."""
    total = int(lengths.sum())
    begin = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - begin


def stream_parquet(
    path: Path,
    target: str,
    store: PackSplit,
    columns: Callable[[PackBlock], dict[str, tuple[np.ndarray, np.ndarray]]],
    progress: Progress | None,
) -> None:
    """Write one Parquet row per pack, block by block (bounded memory), `columns(block)` giving the lists."""
    writer = ParquetRows(path, target, row_group_rows(store.size))
    try:
        for block in iter_blocks(store):
            writer.write(columns(block))
            if progress is not None:
                progress(block.p1, store.n_packs)
    finally:
        writer.close()
