"""Where a packed row's targets are: the `cu_seqlens` check and `pair_targets` (each target's predictor row).

A token with a label is predicted by the row before it in its segment; in the shared-prompt layout
(`prefix_segment`) the first token of each completion by its prompt's last row. Both the
cross-entropy (`cross_entropy.py`) and the pair sums (`pairs.py`) read targets from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from packtool.errors import ConfigError, FormatError

IGNORE_INDEX = -100


def _segments(cu_seqlens: torch.Tensor | np.ndarray, total: int) -> np.ndarray:
    cu = np.asarray(cu_seqlens.detach().cpu() if torch.is_tensor(cu_seqlens) else cu_seqlens, dtype=np.int64).reshape(
        -1
    )
    if cu.size < 2 or cu[0] != 0 or cu[-1] != total or bool(np.any(np.diff(cu) < 0)):
        raise FormatError(
            f"cu_seqlens must run from 0 to {total} (the token count) without decreasing, got {cu[:4].tolist()}...{cu[-2:].tolist()}, packed_cross_entropy, pass the collator's cu_seqlens"
        )
    return cu


@dataclass(frozen=True)
class PairTargets:
    """Where a preference batch's targets are: the row position predicting each (in token order), its
    token, its segment, and per segment whether it is a shared-layout prompt (`pair_targets`)."""

    predictor: torch.Tensor  # int64 [n]: the logit row that predicts the target
    target: torch.Tensor  # int64 [n]: the target token id
    segment: torch.Tensor  # int64 [n]: the target's segment in cu_seqlens
    prompt: torch.Tensor  # bool [S]: the segment is a shared-layout prompt
    n_segments: int


def _batch_cu(batch: dict[str, Any], where: str = "pair_logps") -> torch.Tensor:
    cu = batch.get("cu_seqlens")
    if cu is None:
        cu = batch.get("cu_seq_lens_q")
    if cu is None:
        raise ConfigError(
            f"the batch has neither cu_seqlens nor cu_seq_lens_q, {where}, pass a PackedCollator batch of a "
            "preference pack store"
        )
    return torch.as_tensor(cu).reshape(-1).to(torch.int64)


def pair_targets(batch: dict[str, Any], *, ignore_index: int = IGNORE_INDEX) -> PairTargets:
    """The targets of a preference batch and the logit rows that predict them (vectorised).

    A token with a label is predicted by the row before it in its segment; the FIRST token of a
    shared-layout completion (`prefix_segment` >= 0) by its prompt's last row; the first token of
    any other segment by nothing (as when the sequence runs alone). Pass `predictor` as
    `logits_to_keep` to compute only the rows needed (then `pair_logps(..., kept=True)`).
    """
    for key in ("labels", "pair_ids", "chosen"):
        if batch.get(key) is None:
            raise ConfigError(
                f"the batch has no {key!r}, pair_logps, pass a PackedCollator batch of a preference pack store "
                "(its keys include labels, cu_seqlens, pair_ids, chosen and, when shared, prefix_segment)"
            )
    return _prefix_targets(
        torch.as_tensor(batch["labels"]).reshape(-1),
        _batch_cu(batch),
        batch.get("prefix_segment"),
        ignore_index,
        "pair_logps",
    )


def _prefix_targets(labels: torch.Tensor, cu: torch.Tensor, prefix: Any, ignore_index: int, where: str) -> PairTargets:
    """`pair_targets` of a row: `labels` `[T]`, `cu` `[S+1]`, `prefix` (`prefix_segment` or None)."""
    dev = labels.device
    cu = torch.as_tensor(cu).reshape(-1).to(device=dev, dtype=torch.int64)
    total = labels.numel()
    _segments(cu.cpu(), total)
    n = cu.numel() - 1
    lens = torch.diff(cu)
    seg = torch.repeat_interleave(torch.arange(n, device=dev), lens)
    pos = torch.arange(total, device=dev)
    start = pos == cu.index_select(0, seg)
    pred = pos - 1
    prompt = torch.zeros(n, dtype=torch.bool, device=dev)
    if prefix is not None:
        from packtool.attention.shared_prompt import check_prefix_segment

        pre = torch.as_tensor(prefix).reshape(-1).to(device=dev, dtype=torch.int64)
        check_prefix_segment(cu, pre, where)
        named = pre[pre >= 0]
        prompt[named] = True
        seg_pre = pre.index_select(0, seg)
        has = seg_pre >= 0
        safe = seg_pre.clamp(min=0)
        prompt_last = cu.index_select(0, safe + 1) - 1
        prompt_len = lens.index_select(0, safe)
        shared_first = start & has & (prompt_len > 0)
        pred = torch.where(shared_first, prompt_last, pred)
        start = start & ~shared_first
    valid = (labels != ignore_index) & ~start
    if bool((valid & prompt.index_select(0, seg)).any()):
        raise FormatError(
            f"a shared-layout prompt segment has target labels, {where}, a prompt's tokens are never targets "
            "(labels -100): pass the collator's labels"
        )
    keep = valid.nonzero().reshape(-1)
    return PairTargets(pred.index_select(0, keep), labels.index_select(0, keep).to(torch.int64),
                       seg.index_select(0, keep), prompt, n)  # fmt: skip
