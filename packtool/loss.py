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

Preference pairs (DPO): `pair_logps(logits, batch)` sums each sequence's target log-probs per pair
of a packed preference batch (both layouts; in the shared-prompt layout each completion's first
token is scored by its prompt's last logit), equal to each sequence alone; `dpo_loss` turns policy
and reference sums into TRL's sigmoid / hinge / ipo loss for plain loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


# --- preference pairs (DPO) ---------------------------------------------------------------------------------------

PAIR_LOSSES = ("sigmoid", "hinge", "ipo")


@dataclass(frozen=True)
class PairLogps:
    """Per pair of a batch (in order of first appearance): the summed target log-probs of each sequence.

    `chosen` / `rejected` are TRL's `logps` (sum over the completion tokens, EOS included);
    `chosen_tokens` / `rejected_tokens` count the tokens summed. A pair that occurs twice in the batch
    (a mixture weight above 1 repeats it) is two entries with the same `pair_ids` value.
    """

    pair_ids: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


@dataclass(frozen=True)
class PairTargets:
    """Where a preference batch's targets are: the row position predicting each (in token order), its
    token, its segment, and per segment whether it is a shared-layout prompt (`pair_targets`)."""

    predictor: torch.Tensor  # int64 [n]: the logit row that predicts the target
    target: torch.Tensor  # int64 [n]: the target token id
    segment: torch.Tensor  # int64 [n]: the target's segment in cu_seqlens
    prompt: torch.Tensor  # bool [S]: the segment is a shared-layout prompt
    n_segments: int


def _batch_cu(batch: dict[str, Any]) -> torch.Tensor:
    cu = batch.get("cu_seqlens")
    if cu is None:
        cu = batch.get("cu_seq_lens_q")
    if cu is None:
        raise ConfigError(
            "the batch has neither cu_seqlens nor cu_seq_lens_q, pair_logps, pass a PackedCollator batch of a "
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


def _check_shared_attention(batch: dict[str, Any]) -> None:
    prefix = batch.get("prefix_segment")
    if not isinstance(prefix, torch.Tensor) or not bool((prefix >= 0).any()):
        return
    if not getattr(prefix, "_packtool_shared_prompt", False):
        raise ConfigError(
            "a shared-prompt batch (prefix_segment) whose logits no attn_implementation='packtool' layer computed "
            "with this prefix_segment (eager, sdpa and flash_attention_2 ignore it: the rejected completion would "
            "not see its prompt), pair_logps, load the model with attn_implementation='packtool' (import "
            "packtool.hf) and pass this same batch to model(**batch); check_attention=False if you are sure"
        )


def pair_logps(
    logits: torch.Tensor,
    batch: dict[str, Any],
    *,
    kept: bool = False,
    check_attention: bool = True,
    ignore_index: int = IGNORE_INDEX,
) -> PairLogps:
    """Each pair's chosen and rejected target log-prob sums from the logits of a packed preference batch.

    `logits`: `[T, V]` or `[1, T, V]` over the batch's row, or with `kept=True` only the rows of
    `pair_targets(batch).predictor` (`model(**batch, logits_to_keep=predictor)`). `batch` carries
    `labels` (unshifted), `cu_seqlens` or `cu_seq_lens_q`, `pair_ids`, `chosen` and, for the
    shared-prompt layout, `prefix_segment` (each completion's first token is then scored by its
    prompt's last logit). Equal to each sequence run alone. Raises when a pair's chosen or
    rejected sequence is missing or doubled in the batch, and (`check_attention`) when a shared
    batch's logits were not computed under attn_implementation='packtool' with this batch.
    Half-precision logits are scored in float32.
    """
    targets = pair_targets(batch, ignore_index=ignore_index)
    if check_attention:
        _check_shared_attention(batch)
    rows = logits.reshape(-1, logits.shape[-1]) if logits.ndim >= 2 else logits
    total = torch.as_tensor(batch["labels"]).numel()
    expected = targets.predictor.numel() if kept else total
    if logits.ndim < 2 or rows.shape[0] != expected:
        raise ConfigError(
            f"logits {tuple(logits.shape)} do not hold one row per {'target' if kept else 'token'} "
            f"({expected}), pair_logps, pass the model's logits of this batch"
            + (" computed with logits_to_keep=pair_targets(batch).predictor" if kept else "")
        )
    picked = rows if kept else rows.index_select(0, targets.predictor.to(rows.device))
    if picked.dtype in (torch.float16, torch.bfloat16):
        picked = picked.float()
    logp = torch.log_softmax(picked, -1).gather(1, targets.target.to(rows.device)[:, None]).reshape(-1)
    return _pairs(logp, targets, batch)


def pair_groups(pair_ids: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(pair id of each group, group of each sequence)` for the sequences of a batch (segment order, padding and
    prompts left out): a group is one OCCURRENCE of a pair, its k-th chosen with its k-th rejected sequence, so
    a pair a mixture weight repeats (in one pack, or in two packs of one batch) is two pairs, as in the
    unpacked dataset. Groups are numbered by their pair id, then occurrence."""
    k = pair_ids.numel()
    dev = pair_ids.device
    key = pair_ids.to(torch.int64) * 2 + chosen.to(torch.int64)
    order = torch.argsort(key, stable=True)
    ordered = key.index_select(0, order)
    pos = torch.arange(k, device=dev)
    new = torch.ones(k, dtype=torch.bool, device=dev)
    new[1:] = ordered[1:] != ordered[:-1]
    group_start = torch.cummax(torch.where(new, pos, torch.zeros_like(pos)), 0).values if k else pos
    occurrence = torch.empty_like(pos)
    occurrence[order] = pos - group_start
    uniq, inverse = torch.unique(torch.stack([pair_ids.to(torch.int64), occurrence], 1), dim=0, return_inverse=True)
    return uniq[:, 0], inverse.reshape(-1)


def _pairs(logp: torch.Tensor, targets: PairTargets, batch: dict[str, Any]) -> PairLogps:
    """Per-target log-probs -> per-pair sums (index_add over segments, then over pairs)."""
    dev = logp.device
    n = targets.n_segments
    seg_sum = logp.new_zeros(n).index_add(0, targets.segment.to(dev), logp)
    seg_count = torch.zeros(n, dtype=torch.int64, device=dev).index_add(
        0, targets.segment.to(dev), torch.ones_like(targets.segment, device=dev)
    )
    pair_ids = torch.as_tensor(batch["pair_ids"]).reshape(-1).to(device=dev, dtype=torch.int64)
    chosen = torch.as_tensor(batch["chosen"]).reshape(-1).to(device=dev, dtype=torch.bool)
    if pair_ids.numel() != n or chosen.numel() != n:
        raise FormatError(
            f"pair_ids ({pair_ids.numel()}) and chosen ({chosen.numel()}) need one value per segment ({n}), "
            "pair_logps, pass the collator's keys"
        )
    real = (pair_ids >= 0) & ~targets.prompt.to(dev)
    idx = real.nonzero().reshape(-1)
    uniq, inverse = pair_groups(pair_ids.index_select(0, idx), chosen.index_select(0, idx))
    first = torch.full((uniq.numel(),), n, dtype=torch.int64, device=dev).scatter_reduce(0, inverse, idx, reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=dev)
    slot = rank.index_select(0, inverse)
    is_c = chosen.index_select(0, idx)
    m = uniq.numel()
    n_c = torch.zeros(m, dtype=torch.int64, device=dev).index_add(0, slot, is_c.to(torch.int64))
    n_r = torch.zeros(m, dtype=torch.int64, device=dev).index_add(0, slot, (~is_c).to(torch.int64))
    bad = (n_c != 1) | (n_r != 1)
    if bool(bad.any()):
        which = uniq.index_select(0, order)[bad][:4].tolist()
        raise FormatError(
            f"pairs {which} do not have exactly one chosen and one rejected sequence in this batch, pair_logps, "
            "batch whole pairs (a preference pack store keeps both sequences of a pair in one pack)"
        )
    sums = seg_sum.index_select(0, idx)
    counts = seg_count.index_select(0, idx)
    zero_f = sums.new_zeros(m)
    zero_i = torch.zeros(m, dtype=torch.int64, device=dev)
    c_idx, r_idx = slot[is_c], slot[~is_c]
    return PairLogps(
        pair_ids=uniq.index_select(0, order),
        chosen=zero_f.index_add(0, c_idx, sums[is_c]),
        rejected=zero_f.index_add(0, r_idx, sums[~is_c]),
        chosen_tokens=zero_i.index_add(0, c_idx, counts[is_c]),
        rejected_tokens=zero_i.index_add(0, r_idx, counts[~is_c]),
    )


def dpo_loss(
    policy: PairLogps,
    reference: PairLogps,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """DPO loss of a batch's pairs, as TRL 1.16 computes it (`loss_type` sigmoid, hinge or ipo).

    `policy` / `reference`: `pair_logps` of the same batch under the trained and the reference
    model (the reference without gradients). sigmoid: `-logsigmoid(beta * delta)`, with
    `label_smoothing` (cDPO) `-(1-e) logsigmoid(beta d) - e logsigmoid(-beta d)`; hinge:
    `relu(1 - beta * delta)`; ipo: `(delta_avg - 1/(2 beta))^2` with each log-ratio divided by
    its token count (TRL's normalisation). `reduction` "mean" (TRL's) or "none" (per pair).
    For every TRL loss type use the TRL recipe (`packtool.hf.dpo`).
    """
    if loss_type not in PAIR_LOSSES:
        raise ConfigError(
            f"unknown loss_type {loss_type!r}, dpo_loss, use one of {', '.join(PAIR_LOSSES)} "
            "(every TRL loss type: packtool.hf.dpo.PackedDPOTrainer)"
        )
    if reduction not in ("mean", "none"):
        raise ConfigError(f"unknown reduction {reduction!r}, dpo_loss, use mean or none")
    if policy.pair_ids.shape != reference.pair_ids.shape or not torch.equal(
        policy.pair_ids.cpu(), reference.pair_ids.cpu()
    ):
        raise ConfigError(
            "policy and reference pair_logps are for different pairs, dpo_loss, compute both from the same batch"
        )
    ref_c = reference.chosen.to(policy.chosen.device, policy.chosen.dtype)
    ref_r = reference.rejected.to(policy.rejected.device, policy.rejected.dtype)
    chosen_ratio = policy.chosen - ref_c
    rejected_ratio = policy.rejected - ref_r
    if loss_type == "ipo":
        c = chosen_ratio / policy.chosen_tokens.clamp(min=1).to(chosen_ratio)
        r = rejected_ratio / policy.rejected_tokens.clamp(min=1).to(rejected_ratio)
        losses = (c - r - 1 / (2 * beta)) ** 2
    else:
        delta = beta * (chosen_ratio - rejected_ratio)
        if loss_type == "hinge":
            losses = torch.relu(1 - delta)
        else:
            losses = -F.logsigmoid(delta) * (1 - label_smoothing) - F.logsigmoid(-delta) * label_smoothing
    return losses.mean() if reduction == "mean" else losses
