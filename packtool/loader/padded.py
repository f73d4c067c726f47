"""`PaddedCollator`: documents -> a right-padded `[B, L]` batch with `attention_mask`.

For models without varlen kernels (or as the reference the padding-free modes are checked
against). `L` is the longest document rounded up to `round_to` (tensor-core friendly shapes; the
row length `DynamicBatchSampler(padded=True, round_to=...)` budgets for). Keys:
- `input_ids` (`pad_id` on padding), `labels` (-100 on padding, and as the items have them:
  -100 at each document's first token and at non-targets), `attention_mask` (1 real, 0 padding),
  `position_ids` (`0..L-1` on every row: real tokens count from 0, as they do without padding);
- `n_target_tokens` (int), `lengths` (int64 `[B]`);
- over a preference token store (`DocumentDataset.preference`), per row: `pair_ids` (int64 `[B]`, the
  pair's index in the token store) and `chosen` (bool `[B]`), as TRL's padded DPO batch holds each pair
  as two rows (`DynamicBatchSampler` keeps both in one batch).
Right padding under a causal mask: no real token ever attends to padding, so each document's
logits equal those it gets alone (tests/test_modes_equivalence.py). The scatter into `[B, L]` is
one compiled pass over the output (`fill_padded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numba import njit

from packtool.errors import ConfigError
from packtool.loader.buffers import BufferPool
from packtool.loader.kernels import IGNORE_INDEX


@njit(cache=True, nogil=True)
def fill_padded(ids: np.ndarray, labels: np.ndarray, lens: np.ndarray, pad_id: int, out: np.ndarray) -> None:
    """Scatter documents stored back to back (`ids`, `labels` `[T]`) into `out` `[4, B, L]`: input_ids,
    labels, attention_mask, position_ids, right-padded. One pass over the output."""
    width = out.shape[2]
    col = 0
    for r in range(lens.size):
        n = lens[r]
        for j in range(n):
            out[0, r, j] = ids[col + j]
            out[1, r, j] = labels[col + j]
            out[2, r, j] = 1
            out[3, r, j] = j
        for j in range(n, width):
            out[0, r, j] = pad_id
            out[1, r, j] = IGNORE_INDEX
            out[2, r, j] = 0
            out[3, r, j] = j
        col += n


class PaddedCollator:
    """Collate documents (`DocumentDataset` items, or any dicts with 1-D `input_ids` and `labels`)
    into `[B, L]` tensors padded on the right; `L = round_up(longest, round_to)`."""

    def __init__(self, pad_id: int = 0, round_to: int = 1) -> None:
        if round_to < 1:
            raise ConfigError(f"round_to must be >= 1, got {round_to}, PaddedCollator, pass e.g. round_to=8")
        self.pad_id = int(pad_id)
        self.round_to = int(round_to)
        self._pool: BufferPool | None = None  # output buffers, process-local (a fresh one page-faults)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # each DataLoader worker grows its own

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ConfigError("cannot collate an empty batch, PaddedCollator, use a batch of >= 1 documents")
        flat = getattr(items, "flat", None)
        pairs: tuple[np.ndarray, np.ndarray] | None = None
        if flat is not None:  # DocumentDataset.__getitems__: documents back to back in one buffer
            ids, labels = flat["rows"][0], flat["rows"][1]
            lens = np.asarray(flat["lengths"], dtype=np.int64)
            n_target = int(flat["n_target_total"])
            if "pair_ids" in flat:
                pairs = np.asarray(flat["pair_ids"], np.int64), np.asarray(flat["chosen"], bool)
        else:
            pairs = _pair_rows(items)
            ids = torch.cat([it["input_ids"].reshape(-1) for it in items]).to(torch.int64).numpy()
            labels = torch.cat([it["labels"].reshape(-1) for it in items]).to(torch.int64).numpy()
            lens = np.array([it["input_ids"].numel() for it in items], dtype=np.int64)
            n_target = int(np.count_nonzero(labels != IGNORE_INDEX))
        b = int(lens.size)
        width = -(-int(lens.max()) // self.round_to) * self.round_to
        if self._pool is None:
            self._pool = BufferPool()
        out = self._pool.get(4 * b * width)[: 4 * b * width].reshape(4, b, width)  # one storage, four tensors
        fill_padded(ids, labels, lens, self.pad_id, out)
        t = torch.from_numpy(out)
        batch = {
            "input_ids": t[0],
            "labels": t[1],
            "attention_mask": t[2],
            "position_ids": t[3],
            "n_target_tokens": n_target,
            "lengths": torch.from_numpy(lens.copy()),
        }
        if pairs is not None:
            batch["pair_ids"] = torch.from_numpy(pairs[0].copy())
            batch["chosen"] = torch.from_numpy(pairs[1].copy())
        return batch


def _pair_rows(items: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray] | None:
    """`(pair_ids, chosen)` per row of item dicts that are whole sequences of a preference store, or None."""
    have = ["pair_ids" in it for it in items]
    if not any(have):
        return None
    if not all(have):
        raise ConfigError(
            "some items carry pair_ids and some do not, PaddedCollator, collate documents of one preference token store"
        )
    pair_ids = [np.asarray(it["pair_ids"], np.int64).reshape(-1) for it in items]
    if any(p.size != 1 for p in pair_ids):  # a pack item holds several sequences: one row cannot carry them
        raise ConfigError(
            "an item holds several sequences of a preference store (a pack), PaddedCollator pads one sequence "
            "per row, use DocumentDataset items or PackedCollator for packs"
        )
    chosen = np.array([bool(np.asarray(it["chosen"]).reshape(-1)[0]) for it in items])
    return np.concatenate(pair_ids), chosen
