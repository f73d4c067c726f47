"""`packed_cross_entropy`: next-token cross-entropy over a packed row, equal to each sequence alone.

Labels follow the Hugging Face convention, UNSHIFTED: `labels[t]` is the token at position t
(or -100), and the logits at position `t` are scored against `labels[t+1]`. In a packed row
`[seq 0 | seq 1 | ...]` shifting the whole row by one would score the last position of sequence s
against the first token of sequence s+1; packtool's loaders put -100 at every segment's first token
so that pair is ignored anyway, and this function ALSO masks it from `cu_seqlens` (so labels from
elsewhere are safe): position `t` has a target iff `t+1` is in the same segment and
`labels[t+1] != -100`. The last position of every segment, and of the row, predicts nothing.

Reductions (all exactly what computing each sequence alone gives, up to float rounding):
- `"token"`: sum over targets / number of targets (one sequence's mean, generalised);
- `"sequence"`: mean over sequences of each sequence's token mean (NeMo-RL's sequence-packing loss
  wrapper); sequences without a single target (padding segments) are left out of the mean;
- `"sum"`, `"sequence_sum"`: the numerators of the two, to be divided by GLOBAL counts (below);
- `"none"`: the per-position loss `[T]`, 0 where there is no target.

Neither mean is invariant to how sequences are grouped into micro-batches and ranks: the mean of
per-micro-batch means weighs a token by 1/(targets in its micro-batch). Sum first, divide by the
global count once: `loss = packed_cross_entropy(..., "sum") / global_targets` where
`global_targets` is `count_targets(...)` summed over all micro-batches of the step and all-reduced
over data-parallel ranks (README, "Loss over packed sequences").
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from packtool.errors import ConfigError, FormatError

IGNORE_INDEX = -100
REDUCTIONS = ("token", "sequence", "sum", "sequence_sum", "none")


def _targets(labels: torch.Tensor, cu: np.ndarray, shifted: bool, ignore_index: int) -> torch.Tensor:
    """`[T]` target of each position (`ignore_index` where none)."""
    flat = labels.reshape(-1)
    if shifted:
        return flat
    target = torch.full_like(flat, ignore_index)
    target[:-1] = flat[1:]
    cut = cu[(cu > 0) & (cu < flat.numel())]
    if cut.size:
        target[torch.from_numpy(cut - 1).to(flat.device)] = ignore_index
    return target


def _segments(cu_seqlens: torch.Tensor | np.ndarray, total: int) -> np.ndarray:
    cu = np.asarray(cu_seqlens.detach().cpu() if torch.is_tensor(cu_seqlens) else cu_seqlens, dtype=np.int64).reshape(
        -1
    )
    if cu.size < 2 or cu[0] != 0 or cu[-1] != total or bool(np.any(np.diff(cu) < 0)):
        raise FormatError(
            f"cu_seqlens must run from 0 to {total} (the token count) without decreasing, got {cu[:4].tolist()}...{cu[-2:].tolist()}, packed_cross_entropy, pass the collator's cu_seqlens"
        )
    return cu


def count_targets(
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor | np.ndarray,
    *,
    shifted: bool = False,
    ignore_index: int = IGNORE_INDEX,
) -> tuple[int, int]:
    """(target tokens, sequences with at least one target) of a packed row: the counts to all-reduce."""
    cu = _segments(cu_seqlens, labels.numel())
    valid = (_targets(labels, cu, shifted, ignore_index) != ignore_index).cpu().numpy()
    running = np.concatenate(([0], np.cumsum(valid, dtype=np.int64)))
    per_seq = running[cu[1:]] - running[cu[:-1]]
    return int(valid.sum()), int(np.count_nonzero(per_seq))


def packed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor | np.ndarray,
    reduction: str = "token",
    *,
    shifted: bool = False,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross-entropy of `logits` `[T, V]` (or `[1, T, V]`) against packed unshifted `labels` `[T]`.

    `cu_seqlens` (int, `[S+1]`, 0..T) delimits the sequences. `shifted=True`: `labels[t]` already is
    position t's target (e.g. a context-parallel rank's `shift_labels`, whose local segments are
    `cu_seqlens_local`). Half-precision logits are scored in float32. See the module docstring.
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(f"unknown reduction {reduction!r}, packed_cross_entropy, use one of {', '.join(REDUCTIONS)}")
    total = labels.numel()
    if logits.ndim < 2 or logits.numel() // max(1, logits.shape[-1]) != total:
        raise ConfigError(
            f"logits {tuple(logits.shape)} do not hold one row of scores per label ({total} labels), packed_cross_entropy, pass [T, V] or [1, T, V] logits of the packed row"
        )
    cu = _segments(cu_seqlens, total)
    scores = logits.reshape(total, logits.shape[-1])
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    target = _targets(labels, cu, shifted, ignore_index).to(scores.device)
    per_token = F.cross_entropy(scores, target, ignore_index=ignore_index, reduction="none")
    if reduction == "none":
        return per_token
    if reduction in ("token", "sum"):
        summed = per_token.sum()
        if reduction == "sum":
            return summed
        return summed / max(1, int((target != ignore_index).sum()))
    seg = torch.from_numpy(np.repeat(np.arange(cu.size - 1), np.diff(cu))).to(scores.device)
    valid = (target != ignore_index).to(per_token.dtype)
    seq_sum = per_token.new_zeros(cu.size - 1).index_add(0, seg, per_token)
    seq_count = per_token.new_zeros(cu.size - 1).index_add(0, seg, valid)
    has = seq_count > 0
    means = seq_sum[has] / seq_count[has]
    if reduction == "sequence_sum":
        return means.sum()
    return means.sum() / max(1, int(has.sum()))
