"""`pair_logps`: each pair's chosen and rejected target log-prob sums over a packed preference batch.

Both layouts (pairs, and `pack --share-prompt` where each completion's first token is scored by its
prompt's last logit), equal to each sequence run alone. `pair_groups` numbers each occurrence of a
pair (a mixture weight above 1 repeats one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from packtool.errors import ConfigError, FormatError
from packtool.loss.targets import IGNORE_INDEX, PairTargets, pair_targets


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


@dataclass(frozen=True)
class _Slots:
    """The real sequences of a preference batch (segments; prompts and padding left out) and their pairs."""

    pair_ids: torch.Tensor  # int64 [m]: each pair occurrence, in order of first appearance
    segment: torch.Tensor  # int64 [k]: the segment of each real sequence
    slot: torch.Tensor  # int64 [k]: its pair (index into pair_ids)
    chosen: torch.Tensor  # bool [k]: it is the pair's chosen sequence


def _pair_slots(batch: dict[str, Any], prompt: torch.Tensor, where: str) -> _Slots:
    """Group a batch's sequences into pairs (`pair_groups`), numbered by first appearance; refuse a pair without
    exactly one chosen and one rejected sequence."""
    dev = prompt.device
    n = prompt.numel()
    pair_ids = torch.as_tensor(batch["pair_ids"]).reshape(-1).to(device=dev, dtype=torch.int64)
    chosen = torch.as_tensor(batch["chosen"]).reshape(-1).to(device=dev, dtype=torch.bool)
    if pair_ids.numel() != n or chosen.numel() != n:
        raise FormatError(
            f"pair_ids ({pair_ids.numel()}) and chosen ({chosen.numel()}) need one value per segment ({n}), "
            f"{where}, pass the collator's keys"
        )
    real = (pair_ids >= 0) & ~prompt
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
            f"pairs {which} do not have exactly one chosen and one rejected sequence in this batch, {where}, "
            "batch whole pairs (a preference pack store keeps both sequences of a pair in one pack)"
        )
    return _Slots(uniq.index_select(0, order), idx, slot, is_c)


def _pairs(logp: torch.Tensor, targets: PairTargets, batch: dict[str, Any]) -> PairLogps:
    """Per-target log-probs -> per-pair sums (index_add over segments, then over pairs)."""
    dev = logp.device
    n = targets.n_segments
    seg_sum = logp.new_zeros(n).index_add(0, targets.segment.to(dev), logp)
    seg_count = torch.zeros(n, dtype=torch.int64, device=dev).index_add(
        0, targets.segment.to(dev), torch.ones_like(targets.segment, device=dev)
    )
    s = _pair_slots(batch, targets.prompt.to(dev), "pair_logps")
    m = s.pair_ids.numel()
    sums = seg_sum.index_select(0, s.segment)
    counts = seg_count.index_select(0, s.segment)
    zero_f = sums.new_zeros(m)
    zero_i = torch.zeros(m, dtype=torch.int64, device=dev)
    c_idx, r_idx = s.slot[s.chosen], s.slot[~s.chosen]
    return PairLogps(
        pair_ids=s.pair_ids,
        chosen=zero_f.index_add(0, c_idx, sums[s.chosen]),
        rejected=zero_f.index_add(0, r_idx, sums[~s.chosen]),
        chosen_tokens=zero_i.index_add(0, c_idx, counts[s.chosen]),
        rejected_tokens=zero_i.index_add(0, r_idx, counts[~s.chosen]),
    )
