"""`DocumentDataset`: one item per document of a token store, shaped like a one-segment pack.

Packing offline is one way to stop computing padding; the other is to batch documents as they
are and let varlen kernels see their boundaries: `PackedCollator(flatten=True)` over B items of
this dataset is the padding-free minibatch (VeOmni with `dyn_bsz` off, the packing paper's
"minibatch packing"): the same documents per optimizer step and the same loss as padding them to a
`[B, L]` batch, without computing a single padding position. `PaddedCollator` makes the padded
batch of the same items, and `DynamicBatchSampler` chooses the documents under a token budget.

`ds[i]`: `input_ids`, `labels` (unshifted, -100 at the first token and at non-targets of
`tokens.loss`), `position_ids` (0..L-1), `cu_seqlens = [0, L]` int32, `max_seqlen = L`,
`n_target_tokens`. A whole batch is gathered by one compiled pass (`__getitems__`, which
`DataLoader` calls with the batch's indices) into one flat buffer; the store's memory maps open
lazily per process and are never pickled, as in `PackedDataset`.

Over a preference token store (`tokenize --format preference`: document 2i is pair i's chosen
sequence, 2i+1 its rejected one) each item also carries the pair keys of its one segment, as
`PackedDataset` items do: `pair_ids` (int64 `[1]`, = document // 2), `chosen` (bool `[1]`) and
`prefix_segment` (`[-1]`: a whole sequence); `PackedCollator` and `PaddedCollator` carry them on,
and `DynamicBatchSampler` keeps the two sequences of a pair in one batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numba import njit

from packtool.errors import ConfigError
from packtool.formats.token_store import TokenStore, open_token_store
from packtool.loader.buffers import BufferPool
from packtool.loader.kernels import IGNORE_INDEX


@njit(cache=True, nogil=True)
def fill_documents(
    tokens: np.ndarray,
    loss: np.ndarray,
    has_loss: bool,
    starts: np.ndarray,
    ends: np.ndarray,
    idx: np.ndarray,
    rows: np.ndarray,
    lens: np.ndarray,
    targets: np.ndarray,
) -> int:
    """Write documents `idx` one after another into `rows` `[3, T]` (ids, labels, positions, int64);
    `lens`/`targets` receive each document's length and target count. Returns -1, or the position
    in `idx` of an out-of-range index (nothing meaningful is written then)."""
    n_docs = starts.size
    col = 0
    for r in range(idx.size):
        d = idx[r]
        if d < 0 or d >= n_docs:
            return r
        a = starts[d]
        ln = ends[d] - a
        tgt = 0
        for j in range(ln):
            t = np.int64(tokens[a + j])
            keep = j > 0 and (not has_loss or loss[a + j] != 0)
            rows[0, col + j] = t
            rows[1, col + j] = t if keep else IGNORE_INDEX
            rows[2, col + j] = j
            tgt += keep
        lens[r] = ln
        targets[r] = tgt
        col += ln
    return -1


class DocumentBatchItems(Sequence[dict[str, Any]]):
    """What `DocumentDataset.__getitems__` returns: the batch's documents back to back in `.flat`.

    `PackedCollator` and `PaddedCollator` read `.flat` directly; any other collate function indexes
    it like a list and gets item dicts (views of the flat buffer).
    """

    def __init__(self, flat: dict[str, Any]) -> None:
        self.flat = flat

    def __len__(self) -> int:
        return int(self.flat["lengths"].size)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        rows, lens, cu = self.flat["rows"], self.flat["lengths"], self.flat["offsets"]
        j = int(i) + len(self) if int(i) < 0 else int(i)
        if not 0 <= j < len(self):
            raise IndexError(f"item {i} of a batch of {len(self)}")
        item = _item(rows[:, int(cu[j]) : int(cu[j + 1])], int(lens[j]), int(self.flat["targets"][j]))
        if "pair_ids" in self.flat:
            item["pair_ids"] = torch.tensor([int(self.flat["pair_ids"][j])], dtype=torch.int64)
            item["chosen"] = torch.tensor([bool(self.flat["chosen"][j])])
            item["prefix_segment"] = torch.tensor([-1], dtype=torch.int64)
        return item


def _item(rows: np.ndarray, length: int, targets: int) -> dict[str, Any]:
    t = torch.from_numpy(rows)
    return {
        "input_ids": t[0],
        "labels": t[1],
        "position_ids": t[2],
        "cu_seqlens": torch.tensor([0, length], dtype=torch.int32),
        "max_seqlen": length,
        "n_target_tokens": targets,
    }


class DocumentDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset over the documents of a token store (`packtool tokenize` output).

    `lengths` (int64, one per document) is what `DynamicBatchSampler` plans with; `pad_id` is the
    tokenizer's pad id from the manifest (0 when it has none), for `PaddedCollator(pad_id=ds.pad_id)`.
    Empty documents are items of length 0 (a zero-length segment once collated). `preference` is the pair
    count of a preference token store (its manifest's `preference` key), None for any other store.
    """

    def __init__(self, token_store: str | os.PathLike[str]) -> None:
        self.path = Path(token_store)
        self._pid = -1
        self._store: TokenStore | None = None
        self._views: tuple[np.ndarray, ...] | None = None
        self._pool: BufferPool | None = None
        store = self._open()  # validate now, in the parent, so errors surface before workers start
        if "vision" in store.manifest:  # its items would carry image tokens without their pixels
            raise ConfigError(
                f"{self.path} holds images, DocumentDataset, which yields no pixels, image grids or M-RoPE positions: "
                "pack it (`packtool pack`) and load it with PackedDataset + PackedCollator (docs/VISION.md)"
            )
        self.lengths: np.ndarray = np.asarray(store.lengths, dtype=np.int64)
        pad = store.manifest.get("tokenizer", {}).get("pad_id")
        self.pad_id = int(pad) if isinstance(pad, int) else 0
        self.n_documents = store.n_documents
        #: pairs of a preference token store (documents 2i chosen, 2i+1 rejected); None: a plain store
        self.preference: int | None = store.preference_pairs

    def _open(self) -> TokenStore:
        if self._store is None or self._pid != os.getpid():
            store = open_token_store(self.path)
            loss = np.zeros(0, np.uint8) if store.loss is None else np.asarray(store.loss)
            self._views = (np.asarray(store.tokens), loss, store.starts, np.asarray(store.boundaries, np.int64))
            self._store, self._pool, self._pid = store, BufferPool(), os.getpid()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_store=None, _views=None, _pool=None, _pid=-1)  # each worker re-opens its own maps
        return state

    def __len__(self) -> int:
        return self.n_documents

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([int(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> DocumentBatchItems:
        """Gather several documents at once (one compiled pass); DataLoader calls this."""
        self._open()
        assert self._views is not None and self._pool is not None
        tokens, loss, starts, ends = self._views
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + self.n_documents, idx)
        if idx.size == 0:
            raise ConfigError("cannot gather an empty batch, DocumentDataset, pass at least one index")
        if int(idx.min()) < 0 or int(idx.max()) >= self.n_documents:
            raise IndexError(f"document index out of range 0..{self.n_documents - 1}: got {list(indices)!r}")
        total = int(self.lengths[idx].sum())
        b = int(idx.size)
        buffer = self._pool.get(3 * total + 2 * b + 1)
        rows = buffer[: 3 * total].reshape(3, total)
        lens = buffer[3 * total : 3 * total + b]
        targets = buffer[3 * total + b : 3 * total + 2 * b]
        bad = fill_documents(tokens, loss, loss.size > 0, starts, ends, idx, rows, lens, targets)
        if bad >= 0:  # cannot happen after the check above; kept as the kernel's contract
            raise IndexError(f"document index {int(idx[bad])} out of range 0..{self.n_documents - 1}")
        offsets = np.zeros(b + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        flat: dict[str, Any] = {
            "rows": rows,
            "lengths": lens,
            "offsets": offsets,
            "targets": targets,
            "n_target_total": int(targets.sum()),
            "max_seqlen": int(lens.max()),
        }
        if self.preference is not None:  # each document's pair and side (contract: 2i chosen, 2i+1 rejected)
            flat["pair_ids"] = idx // 2
            flat["chosen"] = idx % 2 == 0
        return DocumentBatchItems(flat)
