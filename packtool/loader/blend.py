"""`BlendedDataset`: a load-time mixture of pack stores, with no per-sample index.

A blend of S pack stores `[(store, weight), ...]` is one long schedule of T samples (one *epoch* of the
blend). Everything about it is computed on the fly from O(S) numbers, never from an array of T:

- **Counts.** Weights count epochs over packs as pack-time mixtures count them over documents
  (`core.mixture`): a store of n packs with weight `k + f` gives `N = k·n + floor(f·n + 1/2)` samples
  (`repeated_count`, exact decimal arithmetic on the weight as written): k full passes over its packs
  and `floor(f·n + 1/2)` distinct packs. T = ΣN.
- **Each store's order.** Sample j of store s is pack `π_{s,e,p}(j mod n)` of pass `p = j // n`, where
  π is a seeded bijection of `range(n)` (a 6-round Feistel network on the next even number of bits,
  cycle-walked back into `range(n)`), keyed by the blend seed, the store's build id (so moving a store
  in the list does not change its order), how often that build came before in the list, the epoch and
  the pass. The last, partial pass takes the first `floor(f·n + 1/2)` entries of its permutation: distinct
  packs. No permutation is ever stored: one vectorised evaluation per batch.
- **The interleave.** The stores are the leaves of a Huffman tree over their counts N_s; each inner node
  splits its own run of samples between its two children by rounding: of the first x samples of a node
  of count M whose first child has count A, `floor(x·A/M + 1/2)` go to the first child. So the sample at
  position t is found by walking from the root (O(depth), vectorised over a range), and the count of
  store s in any prefix t is `t·N_s/T + E` with `|E| <= 1/2·Σ_a N_s/N_a` over the path's nodes a; Huffman
  node counts grow at least like Fibonacci numbers up the tree, so `|E| <= 1.68`: each store is within
  2 samples of its share at EVERY prefix (Megatron's `BlendedDataset` guarantee, without its
  10-bytes-per-sample index). Which child comes first at each node is a seeded coin per epoch, so each
  epoch is a new draw of the interleave too.

Keys: `ds[g]` for `g = epoch·T + t` is sample t of that epoch (`len(ds) == T`; keys >= T reach later epochs,
which is what `PackedSampler` yields, so DataLoader workers need no epoch sync). Items are the store's own
`PackedDataset` items plus `source` (the store's position in `sources`) and `source_index` (the pack).

Opening reads each store's metadata line only; a store's memory maps are opened on first access and kept
in a small LRU (`max_open` stores), so ten thousand stores neither cost 18 s to open nor exhaust file
descriptors.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.blend import BlendPlan, Interleave, parse_source, permute
from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import PackSplit, metadata_name
from packtool.loader.buffers import BufferPool
from packtool.loader.dataset import PackedBatchItems, PackedDataset, build_batch, plain_views
from packtool.loader.segment_reads import SegmentReads

__all__ = ["BlendedDataset", "BlendPlan", "Interleave", "parse_source", "permute"]


class BlendedDataset(BlendPlan):
    """A seeded, exact, prefix-balanced blend of pack stores (module docstring); `ds[g]` is a pack item:
    the store's own `PackedDataset` item plus `source` and `source_index`. The arguments are `BlendPlan`'s.
    """

    def __init__(
        self,
        sources: Sequence[Any],
        seed: int = 0,
        split: str = "training",
        size: int | None = None,
        *,
        max_open: int | None = None,
    ) -> None:
        super().__init__(sources, seed, split, size, max_open=max_open)
        self._open: OrderedDict[int, _Store] = OrderedDict()
        self._layouts: dict[int, tuple[Any, ...]] = {}  # per store opened once: where its arrays lie
        self._segments = SegmentReads(self.directories, self.split, self.size, self.builds, self.n_packs)
        self._pid = os.getpid()

    # -- items ------------------------------------------------------------------------------
    def _store(self, s: int) -> _Store:
        """Store s, opened (LRU of `max_open`). The first open goes through `PackedDataset` (every check of
        the format); a later re-open maps the same files at the recorded offsets: a build's files never
        change, and the metadata line still names them (checked)."""
        if self._pid != os.getpid():  # a forked worker: its own maps
            self._open.clear()
            self._pid = os.getpid()
        handle = self._open.get(s)
        if handle is not None:
            self._open.move_to_end(s)
            return handle
        layout = self._layouts.get(s)
        handle = _Store.reopen(layout) if layout is not None else None
        if handle is None:
            ds = PackedDataset(self.directories[s], self.split, self.size)
            if ds.vision:  # its batches are built below without pixels: refused, never images dropped
                raise ConfigError(
                    f"store {self.paths[s]} holds images, BlendedDataset does not load them yet, use PackedDataset"
                )
            if ds.n_packs != int(self.n_packs[s]):
                raise FormatError(
                    f"store {self.paths[s]} now holds {ds.n_packs} packs, the blend was opened with {int(self.n_packs[s])}, BlendedDataset, re-open the blend"
                )
            split = ds._open()
            if split.build != self.builds[s]:  # re-packed with as many packs (`pack --seed 7`): other packs
                raise FormatError(
                    f"store {self.paths[s]} was re-packed since the blend opened (build {split.build}, the blend "
                    f"was opened with build {self.builds[s]}), BlendedDataset, re-open the blend (a checkpoint of "
                    "the old build does not resume on the new one)"
                )
            handle = _Store(split, ds.has_segment_padding)
            self._layouts[s] = handle.layout()
        self._open[s] = handle
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        return handle

    def segment_table(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """`(pack_offsets, seg_lens)` of store s (memory maps, the store opened)."""
        store = self._store(s).split
        return store.pack_offsets, store.seg_lens

    def segment_lengths(self, s: int, packs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(counts, lens)`: the number of segments of each of the packs `packs` of store s and their lengths, what
        `CostModel` prices packs from; read from two small files without opening the store (`SegmentReads`)."""
        return self._segments.lengths(s, packs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()  # workers open their own maps
        state["_pid"] = -1
        return state

    def __getitem__(self, key: int) -> dict[str, Any]:
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):  # ds[1.5] read ds[1]
            raise ConfigError(
                f"blend key {key!r} is not an integer, BlendedDataset.__getitem__, pass an int (epoch * len(ds) + t)"
            )
        k = int(key)
        if k < -self.total:  # said `blend key -1 is negative` for ds[-len(ds) - 1]
            raise IndexError(
                f"blend key {k} is outside {-self.total} .. 2**63-1 (negative keys count back from epoch 0's end)"
            )
        return self.__getitems__([k + self.total if k < 0 else k])[0]  # -1: the last sample of epoch 0

    def __getitems__(self, keys: Sequence[int]) -> BlendBatchItems:
        if not len(keys):
            raise ConfigError("an empty batch has no items, BlendedDataset.__getitems__, pass at least one key")
        src, packs = self.locate(keys)  # (refuses a key outside int64)
        groups = np.unique(src)
        parts = []
        for s in groups.tolist():
            sel = np.flatnonzero(src == s)
            parts.append((sel, self._store(s).batch(packs[sel])))
        stacked = parts[0][1] if len(parts) == 1 else _merge(parts, src.size)
        stacked = dict(stacked)
        stacked["source"] = src
        stacked["source_index"] = packs
        return BlendBatchItems(stacked)


class _Store:
    """One open store of a blend: its maps, plain views and buffer pool (what `PackedDataset` holds)."""

    ROLES = ("tokens", "pack_offsets", "seg_lens", "seg_pad", "seg_doc", "seg_src", "loss", "seg_pair", "seg_role")

    def __init__(self, split: PackSplit, has_segment_padding: bool) -> None:
        self.split = split
        self.has_segment_padding = has_segment_padding
        self.views = plain_views(split)
        self.pool = BufferPool()

    def batch(self, packs: np.ndarray) -> dict[str, Any]:
        stacked = build_batch(self.split, np.asarray(packs, np.int64), self.views, self.pool)
        stacked["has_segment_padding"] = self.has_segment_padding
        return stacked

    def layout(self) -> tuple[Any, ...]:
        """What re-opening needs: the split's identity, and each map's file, offset, dtype and shape."""
        arrays: list[Any] = []
        for role in self.ROLES:
            arr = getattr(self.split, role, None)
            if arr is None:
                arrays.append(None)
                continue
            if not isinstance(arr, np.memmap) or arr.filename is None:
                return (None,)  # not file-backed: open through PackedDataset every time
            arrays.append((arr.filename, int(arr.offset), arr.dtype.str, tuple(arr.shape)))
        s = self.split
        meta_path = Path(s.directory) / metadata_name(s.size)
        return (
            s.directory,
            s.split,
            s.size,
            s.metadata,
            s.build,
            self.has_segment_padding,
            meta_path,
            _stamp(meta_path),
            arrays,
        )

    @classmethod
    def reopen(cls, layout: tuple[Any, ...]) -> _Store | None:
        """The store mapped again from its layout, or None when its metadata file changed (then the caller
        opens it through `PackedDataset`, every check again)."""
        if layout[0] is None:
            return None
        directory, split, size, metadata, build, padded, meta_path, stamp, arrays = layout
        if _stamp(meta_path) != stamp:
            return None
        try:
            maps: list[Any] = [
                None if a is None else np.memmap(a[0], dtype=np.dtype(a[2]), mode="r", offset=a[1], shape=a[3])
                for a in arrays
            ]
        except (OSError, ValueError):
            return None
        tokens, po, lens, pad, doc, src, loss, pair, role = maps
        store = PackSplit(directory, split, size, metadata, tokens, po, lens, pad, doc, src, loss, build, pair, role)
        return cls(store, padded)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class BlendBatchItems(PackedBatchItems):
    """`PackedBatchItems` whose item dicts also carry `source` and `source_index`."""

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        item = super().__getitem__(i)
        if isinstance(i, slice):
            idx = range(len(self))[i]
            return [
                dict(it, source=int(self.stacked["source"][k]), source_index=int(self.stacked["source_index"][k]))
                for it, k in zip(item, idx, strict=True)
            ]
        k = int(i) + (len(self) if int(i) < 0 else 0)
        return dict(item, source=int(self.stacked["source"][k]), source_index=int(self.stacked["source_index"][k]))


def _merge(parts: list[tuple[np.ndarray, dict[str, Any]]], b: int) -> dict[str, Any]:
    """One `build_batch`-shaped dict from per-store batches; `parts[g] = (positions in the batch, stacked)`."""
    n = int(parts[0][1]["rows"].shape[2])
    entry_pos, lens, real, which = [], [], [], []
    n_rows = int(parts[0][1]["segments"].shape[0])  # 5: lengths, real, entries and targets per pack, store segment
    counts = np.zeros(b, np.int64)
    targets = np.zeros(b, np.int64)
    for sel, st in parts:
        seg, k, bb = st["segments"], st["n_entries"], st["rows"].shape[1]
        c = seg[2, :bb]
        counts[sel] = c
        targets[sel] = seg[3, :bb]
        entry_pos.append(np.repeat(sel, c))
        lens.append(seg[0, :k])
        real.append(seg[1, :k])
        if n_rows > 4:
            which.append(seg[4, :k])
    order = np.argsort(np.concatenate(entry_pos), kind="stable")
    seg_lens = np.concatenate(lens)[order]
    seg_real = np.concatenate(real)[order]
    k = int(seg_lens.size)
    cap = b + k
    buffer = np.empty(3 * b * n + cap + 1, np.int64)
    rows = buffer[: 3 * b * n].reshape(3, b, n)
    cus = buffer[3 * b * n :].view(np.int32).reshape(2, -1)
    for sel, st in parts:
        rows[:, sel, :] = st["rows"]
    cus[:, 0] = 0
    np.cumsum(seg_lens, out=cus[0, 1 : k + 1])
    np.cumsum(seg_real, out=cus[1, 1 : k + 1])
    seg = np.zeros((n_rows, cap), np.int64)
    seg[0, :k], seg[1, :k], seg[2, :b], seg[3, :b] = seg_lens, seg_real, counts, targets
    if n_rows > 4:  # each entry's segment in its own store (-1: padding)
        seg[4, :k] = np.concatenate(which)[order]
    return {
        "buffer": buffer,
        "rows": rows,
        "segments": seg,
        "n_entries": k,
        "cu_seqlens": cus[0, : k + 1],
        "cu_seqlens_real": cus[1, : k + 1],
        "max_seqlen": max(int(st["max_seqlen"]) for _, st in parts),
        "n_target_total": int(sum(int(st["n_target_total"]) for _, st in parts)),
        "has_segment_padding": any(bool(st.get("has_segment_padding")) for _, st in parts),
    }
