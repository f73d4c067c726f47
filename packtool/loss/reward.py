"""`pair_scores`: a reward model's per-token scores over a packed preference batch -> each pair's two rewards.

A sequence-classification model (`AutoModelForSequenceClassification`, `num_labels=1`) scores every
position (`model.score(hidden)`, `[1, T, 1]`) and then keeps one per row: the rightmost token whose
id is not `config.pad_token_id`. On a packed row that pooling would keep one token for the whole
row; `pair_scores` keeps one per sequence instead, by the same rule applied to each sequence alone
(`pad_token_id=`), or simply its last token (`pad_token_id=None`). In the shared-prompt layout a
sequence is its prompt followed by its completion, so an empty completion is scored at its
prompt's last token, as the sequence alone would be. Vectorised: a few scatters, no loop over
segments. `reward_loss` is TRL 1.16's `RewardTrainer` loss on those pairs, for plain loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError, FormatError
from packtool.loss.pairs import _pair_slots
from packtool.loss.targets import IGNORE_INDEX, _batch_cu, _segments

WHERE = "pair_scores"


@dataclass(frozen=True)
class PairScores:
    """Per pair of a batch (in order of first appearance, as `pair_logps`): each sequence's reward.

    `chosen` / `rejected`: the score at the sequence's last token (the row position in
    `chosen_position` / `rejected_position`); `chosen_tokens` / `rejected_tokens`: the sequence's
    length, prompt included (what TRL's padded batch counts in its `attention_mask`).
    """

    pair_ids: torch.Tensor
    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_position: torch.Tensor
    rejected_position: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


def _flat_scores(scores: torch.Tensor, total: int) -> torch.Tensor:
    """`[1, T]`, `[1, T, 1]`, `[T]`, `[T, 1]` or the `[B, N]` / `[B, N, 1]` of an unflattened batch (its
    `cu_seqlens` run over the rows one after another) -> `[T]`."""
    three = scores.ndim == 3 and scores.shape[-1] == 1
    if not (three or scores.ndim in (1, 2)) or scores.numel() != total:
        raise ConfigError(
            f"scores {tuple(scores.shape)} are not one score per token of the batch ({total} tokens), {WHERE}, "
            "pass [1, T] or [1, T, 1] per-token scores (model.score of the base model's last hidden state, "
            "num_labels=1)"
        )
    return scores.reshape(-1)


#: keys that hold each segment's REAL length (without `--pad-multiple` padding) as offsets like `cu_seqlens`:
#: a `PackedDataset` item's / `PreferencePackCollator`'s, and `PackedCollator`'s (Megatron's name)
UNPADDED_KEYS = ("cu_seqlens_unpadded", "cu_seqlens_q")


def _real_lengths(batch: dict[str, Any], cu: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Each segment's length without its `--pad-multiple` padding. Without a key that says it, a batch is taken
    as unpadded unless a sequence ends on an unlabelled token (padding then cannot be told from the sequence)."""
    lens = torch.diff(cu)
    for key in UNPADDED_KEYS:
        if batch.get(key) is None:
            continue
        cu_real = torch.as_tensor(batch[key]).reshape(-1).to(device=cu.device, dtype=torch.int64)
        real = torch.diff(cu_real) if cu_real.shape == cu.shape else lens.new_full(lens.shape, -1)
        if bool(((real < 0) | (real > lens)).any()):
            raise FormatError(
                f"{key} {cu_real.tolist()[:8]} does not fit cu_seqlens {cu.tolist()[:8]}, {WHERE}, pass the "
                "collator's batch (each segment's real length at most its length)"
            )
        return real
    labels = batch.get("labels")
    if labels is not None and seqs.numel():
        flat = torch.as_tensor(labels).reshape(-1).to(cu.device)
        last = (cu.index_select(0, seqs + 1) - 1).clamp(min=0)
        if bool(((flat.index_select(0, last) == IGNORE_INDEX) & (lens.index_select(0, seqs) > 0)).any()):
            raise FormatError(
                f"a pair's sequence ends on an unlabelled token and the batch has no {' or '.join(UNPADDED_KEYS)}, "
                f"{WHERE}, the --pad-multiple padding inside a segment cannot be told from the sequence: keep the "
                "collator's cu_seqlens_unpadded (PackedDataset items) or cu_seqlens_q (PackedCollator without keys=)"
            )
    return lens


def pair_scores(scores: torch.Tensor, batch: dict[str, Any], *, pad_token_id: int | None = None) -> PairScores:
    """Each pair's chosen and rejected reward from the per-token scores of a packed preference batch.

    `scores`: `[1, T]`, `[1, T, 1]`, `[T]` or `[T, 1]` over the batch's row (`[B, N]` / `[B, N, 1]` for an
    unflattened batch, whose `cu_seqlens` run over its rows in order). `batch` carries
    `cu_seqlens` (or `cu_seq_lens_q`), `pair_ids`, `chosen`, `prefix_segment` when shared, and
    `input_ids` when `pad_token_id` is given. A sequence's score is read at its last token; with
    `pad_token_id`, at its rightmost token that is not `pad_token_id` (its first token when every
    one is), which is what `*ForSequenceClassification` reads of that sequence alone: TRL sets
    `pad_token_id` to the EOS id when the tokenizer has no pad token, so a sequence ending with EOS
    is then scored at the token before it. `--pad-multiple` padding inside a segment is never read
    (nor counted in `*_tokens`): the segments' real lengths come from `cu_seqlens_unpadded` or
    `cu_seqlens_q`, and a batch with neither whose sequence ends on an unlabelled token is refused.
    Refuses an empty sequence (nothing to score) and a pair without exactly one chosen and one
    rejected sequence. Gradients flow to the picked scores.
    """
    cu = _batch_cu(batch, WHERE)
    total = int(cu[-1]) if cu.numel() else 0
    flat = _flat_scores(scores, total)
    dev = flat.device
    cu = cu.to(dev)
    _segments(cu.cpu(), total)
    n = cu.numel() - 1
    lens = torch.diff(cu)
    for key in ("pair_ids", "chosen"):
        if batch.get(key) is None:
            raise ConfigError(
                f"the batch has no {key!r}, {WHERE}, pass a PackedCollator batch of a preference pack store "
                "(its keys include cu_seqlens, pair_ids, chosen and, when shared, prefix_segment)"
            )
    prefix = batch.get("prefix_segment")
    pre = torch.full((n,), -1, dtype=torch.int64, device=dev)
    if prefix is not None:
        from packtool.attention.shared_prompt import check_prefix_segment

        pre = torch.as_tensor(prefix).reshape(-1).to(device=dev, dtype=torch.int64)
        check_prefix_segment(cu, pre, WHERE)
    prompt = torch.zeros(n, dtype=torch.bool, device=dev)
    prompt[pre[pre >= 0]] = True
    slots = _pair_slots(batch, prompt, WHERE)
    pos = torch.arange(total, device=dev)
    candidate = pos
    if pad_token_id is not None:
        if batch.get("input_ids") is None:
            raise ConfigError(f"pad_token_id without the batch's input_ids, {WHERE}, pass the collator's batch")
        ids = torch.as_tensor(batch["input_ids"]).reshape(-1).to(dev)
        if ids.numel() != total:
            raise FormatError(f"input_ids hold {ids.numel()} tokens, cu_seqlens {total}, {WHERE}, pass one batch")
        candidate = torch.where(ids != pad_token_id, pos, -1)
    real = _real_lengths(batch, cu, slots.segment)
    seg_of = torch.repeat_interleave(torch.arange(n, device=dev), lens)
    candidate = torch.where(pos < (cu[:-1] + real).index_select(0, seg_of), candidate, -1)  # padding: never read
    rightmost = torch.full((n,), -1, dtype=torch.int64, device=dev).scatter_reduce(0, seg_of, candidate, "amax")
    s = slots.segment
    own_prompt = pre.index_select(0, s)
    shared = own_prompt >= 0
    p = own_prompt.clamp(min=0)
    picked = torch.where(rightmost.index_select(0, s) >= 0, rightmost.index_select(0, s),
                         torch.where(shared, rightmost.index_select(0, p), -1))  # fmt: skip
    prompt_len = torch.where(shared, real.index_select(0, p), 0)
    first = torch.where(prompt_len > 0, cu.index_select(0, p), torch.where(real.index_select(0, s) > 0, cu[s], -1))
    picked = torch.where(picked >= 0, picked, first)
    if bool((picked < 0).any()):
        which = slots.pair_ids.index_select(0, slots.slot[picked < 0])[:4].tolist()
        raise FormatError(
            f"pairs {which} hold an empty sequence (no token to score), {WHERE}, drop empty sequences before packing"
        )
    values = flat.index_select(0, picked)
    length = real.index_select(0, s) + prompt_len
    m = slots.pair_ids.numel()
    c, r = slots.chosen, ~slots.chosen
    out_pos = torch.zeros(m, dtype=torch.int64, device=dev)
    return PairScores(
        pair_ids=slots.pair_ids,
        chosen=values.new_zeros(m).index_add(0, slots.slot[c], values[c]),
        rejected=values.new_zeros(m).index_add(0, slots.slot[r], values[r]),
        chosen_position=out_pos.index_add(0, slots.slot[c], picked[c]),
        rejected_position=out_pos.index_add(0, slots.slot[r], picked[r]),
        chosen_tokens=out_pos.index_add(0, slots.slot[c], length[c]),
        rejected_tokens=out_pos.index_add(0, slots.slot[r], length[r]),
    )


def reward_loss(
    scores: PairScores,
    *,
    margin: torch.Tensor | float | None = None,
    center_rewards_coefficient: float | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """TRL 1.16 `RewardTrainer`'s loss: `-logsigmoid(chosen - rejected - margin)`, mean over pairs, plus
    `center_rewards_coefficient * mean((chosen + rejected) ** 2)` when given. `margin`: one per pair (in
    `scores.pair_ids` order, e.g. `margins[scores.pair_ids]`) or a number. `reduction` "mean" (TRL's) or "none"
    (per pair; its mean is the "mean")."""
    if reduction not in ("mean", "none"):
        raise ConfigError(f"unknown reduction {reduction!r}, reward_loss, use mean or none")
    if not scores.pair_ids.numel():
        raise ConfigError("no pairs to score (the mean would be NaN), reward_loss, pass a batch holding pairs")
    delta = scores.chosen - scores.rejected
    if margin is not None:
        m = torch.as_tensor(margin, device=delta.device)
        if m.numel() not in (1, delta.numel()):
            raise ConfigError(
                f"margin holds {m.numel()} values for {delta.numel()} pairs, reward_loss, pass one per pair in "
                "scores.pair_ids order (or one number)"
            )
        delta = delta - m.to(delta.dtype).reshape(-1)
    losses = -F.logsigmoid(delta)
    if center_rewards_coefficient is not None:
        losses = losses + center_rewards_coefficient * (scores.chosen + scores.rejected) ** 2
    return losses.mean() if reduction == "mean" else losses
