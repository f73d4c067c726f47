"""`PaddedCollator`: documents -> a right-padded `[B, L]` batch with `attention_mask`.

For models without varlen kernels (or as the reference the padding-free modes are checked
against). `L` is the longest document rounded up to `round_to` (tensor-core friendly shapes; the
row length `DynamicBatchSampler(padded=True, round_to=...)` budgets for). Keys:
- `input_ids` (`pad_id` on padding), `labels` (-100 on padding, and as the items have them:
  -100 at each document's first token and at non-targets), `attention_mask` (1 real, 0 padding),
  `position_ids` (`0..L-1` on every row: real tokens count from 0, as they do without padding);
- `n_target_tokens` (int), `lengths` (int64 `[B]`).
Right padding under a causal mask: no real token ever attends to padding, so each document's
logits equal those it gets alone (tests/test_modes_equivalence.py). The scatter into `[B, L]` is
one vectorised index assignment per array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from packtool.errors import ConfigError
from packtool.loader.kernels import IGNORE_INDEX


class PaddedCollator:
    """Collate documents (`DocumentDataset` items, or any dicts with 1-D `input_ids` and `labels`)
    into `[B, L]` tensors padded on the right; `L = round_up(longest, round_to)`."""

    def __init__(self, pad_id: int = 0, round_to: int = 1) -> None:
        if round_to < 1:
            raise ConfigError(f"round_to must be >= 1, got {round_to}, PaddedCollator, pass e.g. round_to=8")
        self.pad_id = int(pad_id)
        self.round_to = int(round_to)

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ConfigError("cannot collate an empty batch, PaddedCollator, use a batch of >= 1 documents")
        flat = getattr(items, "flat", None)
        if flat is not None:  # DocumentDataset.__getitems__: documents back to back in one buffer
            rows = torch.from_numpy(flat["rows"])
            ids, labels = rows[0], rows[1]
            lens = np.asarray(flat["lengths"], dtype=np.int64)
            n_target = int(flat["n_target_total"])
        else:
            ids = torch.cat([it["input_ids"].reshape(-1) for it in items])
            labels = torch.cat([it["labels"].reshape(-1) for it in items])
            lens = np.array([it["input_ids"].numel() for it in items], dtype=np.int64)
            n_target = int((labels != IGNORE_INDEX).sum())
        b = int(lens.size)
        longest = int(lens.max())
        width = -(-longest // self.round_to) * self.round_to
        # the (row, column) of every real token: one vectorised scatter per array
        row = torch.from_numpy(np.repeat(np.arange(b, dtype=np.int64), lens))
        starts = np.cumsum(lens) - lens
        col = torch.from_numpy(np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(starts, lens))
        out_ids = torch.full((b, width), self.pad_id, dtype=torch.int64)
        out_labels = torch.full((b, width), IGNORE_INDEX, dtype=torch.int64)
        mask = torch.zeros((b, width), dtype=torch.int64)
        out_ids[row, col] = ids.to(torch.int64)
        out_labels[row, col] = labels.to(torch.int64)
        mask[row, col] = 1
        return {
            "input_ids": out_ids,
            "labels": out_labels,
            "attention_mask": mask,
            "position_ids": torch.arange(width, dtype=torch.int64).expand(b, width).contiguous(),
            "n_target_tokens": n_target,
            "lengths": torch.from_numpy(lens.copy()),
        }
