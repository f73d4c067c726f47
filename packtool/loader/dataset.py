"""`PackedDataset`: one item per pack, built from the pack store's memory maps with numpy only.

Every pack row `[N]` becomes `input_ids`, unshifted `labels` (-100 at each segment's first
token, at non-target tokens, on `--pad-multiple` padding and on the tail padding),
`position_ids` restarting at 0 per segment and `cu_seqlens` (tail padding its own segment).
The per-pack segment lists come from the CSR companions (`pack_offsets`, `seg_lens`,
`seg_pad`), so nothing per pack parses JSON, and a whole batch is built with ~10 vectorised
passes over its tokens (`__getitems__`, which `torch.utils.data.DataLoader` calls with the
batch's indices): no Python loop ever runs per token or per segment.

The maps are opened lazily and re-opened when the process id changes, and `__getstate__`
drops them, so DataLoader workers (fork or spawn) share the page cache instead of copying.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import PackSplit, find_pack_dir, metadata_for, open_pack_split, sizes_in

IGNORE_INDEX = -100
_DATA_FILE = re.compile(r"^(?P<split>.+)_(?P<size>\d+)\.npy$")


class PackedBatchItems(Sequence[dict[str, Any]]):
    """What `__getitems__` returns: the stacked batch arrays, seen as a sequence of item dicts.

    `PackedCollator` takes `.stacked` directly (no per-item dicts, no re-stacking); any other
    collate function indexes it like a list and gets item dicts built on demand (views).
    """

    def __init__(self, stacked: dict[str, Any]) -> None:
        self.stacked = stacked
        self._items: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.stacked["input_ids"].shape[0])

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if self._items is None:
            self._items = _split_items(self.stacked)
        return self._items[i]


class PackedDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset over one (split, size) of a pack store; `ds[i]` is pack i.

    `path` is a `packed/{tokenizer}` directory, a pack ROOT holding one tokenizer, or a
    `{split}_{N}.npy` file (which then fixes split and size). `size` may be left out when the
    directory holds one size only.
    """

    def __init__(self, path: str | os.PathLike[str], split: str = "training", size: int | None = None) -> None:
        p = Path(path)
        if p.is_file():
            m = _DATA_FILE.match(p.name)
            if m is None:
                raise ConfigError(f"{p.name} is not a pack file named {{split}}_{{N}}.npy, {p}, pass the pack directory or a {{split}}_{{N}}.npy file")
            split, file_size = m["split"], int(m["size"])
            if size is not None and size != file_size:
                raise ConfigError(f"size={size} contradicts the file name {p.name}, {p}, drop size= or pass the matching file")
            size = file_size
        self.directory = find_pack_dir(p)
        sizes = sizes_in(self.directory)
        if size is None:
            if len(sizes) != 1:
                found = ", ".join(map(str, sizes)) or "none"
                raise ConfigError(f"pack directory holds sizes {found}, {self.directory}, pass size=N to choose one")
            size = sizes[0]
        elif size not in sizes:
            found = ", ".join(map(str, sizes)) or "none"
            raise ConfigError(f"no packs of size {size} (found {found}), {self.directory}, pass one of those or run `packtool pack --size {size}`")
        self.split = split
        self.size = int(size)
        self.metadata: dict[str, Any] = metadata_for(self.directory, split, self.size)
        self.pad_id = int(self.metadata.get("pad_id", 0))
        self._pid = -1
        self._store: PackSplit | None = None
        store = self._open()  # validate now, in the parent, so errors surface before workers start
        self.n_packs = store.n_packs
        #: Megatron's *_padded cu_seqlens only make sense when --pad-multiple padded something
        self.has_segment_padding = bool(store.seg_pad.size and np.any(store.seg_pad))

    # -- process-local memory maps -------------------------------------------------------
    def _open(self) -> PackSplit:
        if self._store is None or self._pid != os.getpid():
            self._store = open_pack_split(self.directory, self.split, self.size)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # never pickle the maps: each worker re-opens its own
        state["_pid"] = -1
        return state

    # -- items -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n_packs

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = int(index)
        if i < 0:
            i += self.n_packs
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> PackedBatchItems:
        """Build several packs at once (vectorised over the batch); DataLoader calls this."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.n_packs):
            raise IndexError(f"pack index out of range 0..{self.n_packs - 1}: got {indices!r}")
        stacked = build_batch(self._open(), idx)
        stacked["has_segment_padding"] = self.has_segment_padding
        return PackedBatchItems(stacked)


def build_batch(store: PackSplit, idx: np.ndarray) -> dict[str, Any]:
    """Stacked arrays for the packs `idx`: `[B, N]` ids/labels/positions and per-segment lengths.

    Segment arrays cover every pack in order, each pack's segments followed by its tail
    padding segment (dropped from `seg_lens` when empty). `seg_counts[b]` says how many
    entries pack b owns, so per-pack `cu_seqlens` are slices of one global cumsum.
    """
    n = store.size
    b = int(idx.size)
    tokens = store.tokens[idx]  # one fancy-index copy of the rows out of the map
    input_ids = tokens.astype(np.int64)
    po = store.pack_offsets
    s0 = np.asarray(po[idx], dtype=np.int64)
    counts = np.asarray(po[idx + 1], dtype=np.int64) - s0
    n_seg = int(counts.sum())
    ends = np.cumsum(counts)
    seg_index = np.repeat(s0 - (ends - counts), counts) + np.arange(n_seg, dtype=np.int64)
    lens = np.asarray(store.seg_lens[seg_index], dtype=np.int64)
    pads = np.asarray(store.seg_pad[seg_index], dtype=np.int64)
    csum = np.concatenate(([0], np.cumsum(lens)))
    used = csum[ends] - csum[ends - counts]
    if n_seg and (lens.min() < 0 or pads.min() < 0 or bool(np.any(pads > lens))) or bool(np.any(used > n)):
        bad = int(idx[np.argmax(used > n)]) if bool(np.any(used > n)) else int(idx[0])
        raise FormatError(f"pack {bad} has inconsistent segment lengths (sum {int(used.max())} > {n}, or padding > length), {store.directory}, re-run `packtool pack`")
    tail = n - used
    all_lens = np.insert(lens, ends, tail)  # each pack's segments, then its tail
    all_pads = np.insert(pads, ends, tail)  # the tail is padding through and through
    is_tail = np.insert(np.zeros(n_seg, dtype=bool), ends, True)
    starts = np.concatenate(([0], np.cumsum(all_lens)[:-1]))  # flat offsets: rows are contiguous
    total = b * n
    position_ids = np.arange(total, dtype=np.int64) - np.repeat(starts, all_lens)
    # mask = not a target: the padded end of each segment (whole tail), segment first tokens, loss==0
    k = all_lens.size
    mask = np.repeat(np.tile(np.array([False, True]), k), np.stack([all_lens - all_pads, all_pads], 1).ravel())
    mask[starts[all_lens > 0]] = True
    if store.loss is not None:
        mask |= store.loss[idx].reshape(-1) == 0
    labels = input_ids.copy()
    np.putmask(labels.reshape(-1), mask, IGNORE_INDEX)
    keep = (all_lens > 0) | ~is_tail  # drop empty tails; keep real segments even if empty
    pack_of = np.repeat(np.arange(b), counts + 1)[keep]
    seg_counts = np.bincount(pack_of, minlength=b).astype(np.int64)
    return {
        "input_ids": input_ids.reshape(b, n),
        "labels": labels.reshape(b, n),
        "position_ids": position_ids.reshape(b, n),
        "seg_lens": all_lens[keep],
        "seg_real": (all_lens - all_pads * ~is_tail)[keep],  # without --pad-multiple padding (Megatron)
        "seg_counts": seg_counts,
        "n_target_tokens": (n - mask.reshape(b, n).sum(axis=1)).astype(np.int64),
    }


def _split_items(stacked: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-pack item dicts whose tensors are views of the stacked arrays (no copy)."""
    ids = torch.from_numpy(stacked["input_ids"])
    labels = torch.from_numpy(stacked["labels"])
    pos = torch.from_numpy(stacked["position_ids"])
    seg_lens, seg_real, counts = stacked["seg_lens"], stacked["seg_real"], stacked["seg_counts"]
    bounds = np.concatenate(([0], np.cumsum(counts)))
    items = []
    for r in range(ids.shape[0]):  # per pack, not per token
        a, c = int(bounds[r]), int(bounds[r + 1])
        lens = seg_lens[a:c]
        cu = np.zeros(lens.size + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        cu_real = np.zeros(lens.size + 1, dtype=np.int32)
        np.cumsum(seg_real[a:c], out=cu_real[1:])
        items.append({
            "input_ids": ids[r],
            "labels": labels[r],
            "position_ids": pos[r],
            "cu_seqlens": torch.from_numpy(cu),
            "cu_seqlens_unpadded": torch.from_numpy(cu_real),
            "max_seqlen": int(lens.max()) if lens.size else 0,
            "n_target_tokens": int(stacked["n_target_tokens"][r]),
        })
    return items
