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

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packtool.errors import ConfigError
from packtool.loss.targets import IGNORE_INDEX, _prefix_targets, _segments

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


def count_targets(
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor | np.ndarray,
    *,
    shifted: bool = False,
    ignore_index: int = IGNORE_INDEX,
    prefix_segment: torch.Tensor | np.ndarray | None = None,
) -> tuple[int, int]:
    """(target tokens, sequences with at least one target) of a packed row: the counts to all-reduce.
    `prefix_segment`: as in `packed_cross_entropy` (a shared-prompt batch)."""
    if _is_shared(prefix_segment):
        _no_shifted_shared(shifted, "count_targets")
        found = _prefix_targets(labels.reshape(-1), torch.as_tensor(np.asarray(cu_seqlens)), prefix_segment,
                                ignore_index, "count_targets")  # fmt: skip
        return int(found.target.numel()), int(torch.unique(found.segment).numel())
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
    prefix_segment: torch.Tensor | np.ndarray | None = None,
) -> torch.Tensor:
    """Cross-entropy of `logits` `[T, V]` (or `[1, T, V]`) against packed unshifted `labels` `[T]`.

    `cu_seqlens` (int, `[S+1]`, 0..T) delimits the sequences. `shifted=True`: `labels[t]` already is
    position t's target (e.g. a context-parallel rank's `shift_labels`, whose local segments are
    `cu_seqlens_local`). Half-precision logits are scored in float32. See the module docstring.

    A shared-prompt preference batch (`pack --share-prompt`) MUST pass `prefix_segment=batch["prefix_segment"]`:
    each completion's first token is then scored by its prompt's last logit (as each sequence alone),
    and a "sequence" is each completion. Without it that token is left out, and nothing in
    `(logits, labels, cu_seqlens)` tells a shared row from a plain one. Reduction "none" (one loss per
    position) and `shifted=True` are refused with it: a prompt's last position predicts two tokens.
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(f"unknown reduction {reduction!r}, packed_cross_entropy, use one of {', '.join(REDUCTIONS)}")
    total = labels.numel()
    if logits.ndim < 2 or logits.numel() // max(1, logits.shape[-1]) != total:
        raise ConfigError(
            f"logits {tuple(logits.shape)} do not hold one row of scores per label ({total} labels), packed_cross_entropy, pass [T, V] or [1, T, V] logits of the packed row"
        )
    if _is_shared(prefix_segment):
        return _shared_cross_entropy(logits, labels, cu_seqlens, reduction, shifted, ignore_index, prefix_segment)
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


def _is_shared(prefix_segment: Any) -> bool:
    """A `prefix_segment` that names at least one prompt (all -1, e.g. the pairs layout: a plain row)."""
    if prefix_segment is None:
        return False
    return bool((torch.as_tensor(np.asarray(prefix_segment) if not torch.is_tensor(prefix_segment)
                                 else prefix_segment) >= 0).any())  # fmt: skip


def _no_shifted_shared(shifted: bool, where: str) -> None:
    if shifted:
        raise ConfigError(
            f"shifted=True with a shared-prompt prefix_segment, {where}, pass the unshifted labels (a prompt's "
            "last position predicts the first token of both completions)"
        )


def _shared_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    cu_seqlens: torch.Tensor | np.ndarray,
    reduction: str,
    shifted: bool,
    ignore_index: int,
    prefix_segment: Any,
) -> torch.Tensor:
    """`packed_cross_entropy` of a shared-prompt row: every target scored by its predictor row
    (`pair_targets`), so each completion is exactly its sequence alone."""
    _no_shifted_shared(shifted, "packed_cross_entropy")
    if reduction == "none":
        raise ConfigError(
            "reduction 'none' with a shared-prompt prefix_segment, packed_cross_entropy, a prompt's last position "
            "predicts the first token of both completions (one loss per position cannot hold both): use token, "
            "sequence, sum or sequence_sum"
        )
    cu = torch.as_tensor(np.asarray(cu_seqlens) if not torch.is_tensor(cu_seqlens) else cu_seqlens)
    found = _prefix_targets(labels.reshape(-1), cu, prefix_segment, ignore_index, "packed_cross_entropy")
    scores = logits.reshape(labels.numel(), logits.shape[-1])
    picked = scores.index_select(0, found.predictor.to(scores.device))
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    per_target = F.cross_entropy(picked, found.target.to(scores.device), reduction="none")
    if reduction in ("token", "sum"):
        summed = per_target.sum()
        return summed if reduction == "sum" else summed / max(1, per_target.numel())
    seg = found.segment.to(scores.device)
    seq_sum = per_target.new_zeros(found.n_segments).index_add(0, seg, per_target)
    seq_count = per_target.new_zeros(found.n_segments).index_add(0, seg, torch.ones_like(per_target))
    has = seq_count > 0
    means = seq_sum[has] / seq_count[has]
    if reduction == "sequence_sum":
        return means.sum()
    return means.sum() / max(1, int(has.sum()))
