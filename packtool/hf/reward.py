"""TRL 1.16's `RewardTrainer` on packtool preference packs: `PackedRewardTrainer`, TRL's loss and metrics, exact.

    import packtool.hf
    from packtool.hf.reward import PackedRewardTrainer, RewardPackCollator
    from packtool.hf.dpo import packs_dataset
    packs = packs_dataset("packs/", size=4096)       # the same preference pack store DPO trains on
    model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=1, attn_implementation="packtool")
    trainer = PackedRewardTrainer(model=model, args=RewardConfig(..., max_length=None), train_dataset=packs,
                                  processing_class=tok)   # data_collator: RewardPackCollator() by default

A reward model is trained on the same chosen/rejected pairs as DPO, so the packs of `pack` on a
`tokenize --format preference` store serve as they are (both layouts; a sequence is its prompt
followed by its completion, as TRL 1.16's RewardTrainer tokenizes `prompt + chosen`). The trainer
runs the model ONCE per batch on the `[1, T]` row under attn_implementation="packtool", takes the
head's per-token scores (a forward hook on the `score` head: the call itself goes through the
model's own forward, so a wrapper such as DDP sees an ordinary call) and reads each sequence's
score where `*ForSequenceClassification` would read it on that sequence alone: the rightmost token
that is not `config.pad_token_id` (`packtool.loss.pair_scores`). Then TRL's own arithmetic:
`-logsigmoid(chosen - rejected - margin)`, `center_rewards_coefficient`, and the metrics TRL logs
(`num_tokens`, `min_reward`, `mean_reward`, `max_reward`, `accuracy`, `margin`), with the rewards laid
out as TRL's `outputs.logits` (`[2B, 1]`: chosen rows, then rejected) for evaluation
(tests/interop/test_trl_reward.py: loss, metrics and every gradient equal TRL's padded run within 1e-6).

Margins: TRL reads a `margin` column per record; packs hold many pairs, so `with_margins(packs, margins)`
adds one value per segment (`margins[pair_id]`, `margins` indexed by the pair's index in the token store).
`max_length`: TRL drops a pair with a sequence longer than it (default 1024); packs keep every pair,
so a batch holding a longer sequence is refused (pass `max_length=None`). Torch side: imports trl;
`import packtool` never imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import SequenceClassifierOutputWithPast
from trl import RewardTrainer

from packtool.errors import ConfigError
from packtool.hf.dpo import MODEL_KEYS, PACK_KEYS, PreferencePackCollator
from packtool.hf.shared_prompt import KEY, SEEN
from packtool.loss.reward import PairScores, pair_scores

#: the per-segment margin column `with_margins` adds (TRL's per-record `margin`)
MARGIN = "margin"
#: each segment's real length (without `--pad-multiple` padding), as offsets: `PackedDataset` items carry it
UNPADDED = "cu_seqlens_unpadded"
WHERE = "packtool.hf.reward"


def with_margins(packs: Any, margins: Sequence[float] | torch.Tensor) -> Any:
    """`packs` (a `packs_dataset`) with a `margin` column: per pack, one value per segment, `margins[pair_id]`
    (0 for padding). `margins` is indexed by pair id (the pair's index in the token store)."""
    table = torch.as_tensor(margins, dtype=torch.float64).reshape(-1)
    column = []
    for i, pair_ids in enumerate(packs["pair_ids"]):
        ids = torch.as_tensor(pair_ids, dtype=torch.int64)
        if ids.numel() and int(ids.max()) >= table.numel():
            raise ConfigError(
                f"pack {i} holds pair {int(ids.max())} but margins has {table.numel()} values, {WHERE}, pass one "
                "margin per pair of the token store (indexed by pair id)"
            )
        column.append(torch.where(ids >= 0, table[ids.clamp(min=0)], 0.0).tolist())
    if MARGIN in packs.column_names:
        packs = packs.remove_columns(MARGIN)
    return packs.add_column(MARGIN, column)


class RewardPackCollator(PreferencePackCollator):
    """`PreferencePackCollator`'s flattened `[1, T]` batch, plus `margin` (float32 per segment, as TRL's
    collator makes it float32) when the packs carry one (`with_margins`), and `cu_seqlens_unpadded` when they
    carry it (`pair_scores` then never reads nor counts `--pad-multiple` padding)."""

    def __call__(self, packs: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().__call__(packs)
        if batch.get(UNPADDED) is None and all(p.get(UNPADDED) is not None for p in packs):
            # each segment's real length (a --pad-multiple store): offsets over the batch, as cu_seqlens
            real = [torch.diff(torch.as_tensor(p[UNPADDED], dtype=torch.int64).reshape(-1)) for p in packs]
            batch[UNPADDED] = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(real).cumsum(0)]).to(torch.int32)
        has = [p.get(MARGIN) is not None for p in packs]
        if any(has) and not all(has):
            raise ConfigError(f"packs with and without a margin in one batch, {WHERE}, add margins to every pack")
        if all(has):
            batch[MARGIN] = torch.cat([torch.as_tensor(p[MARGIN], dtype=torch.float32).reshape(-1) for p in packs])
            if batch[MARGIN].numel() != batch["pair_ids"].numel():
                raise ConfigError(f"a pack's margin is not one value per segment, {WHERE}, add it with with_margins")
        return batch


def _score_head(model: Any) -> torch.nn.Module:
    """The sequence-classification head (`score`, as `GenericForSequenceClassification` names it), wrappers
    (DDP, PEFT's ModulesToSaveWrapper) included: the outermost module so named."""
    found = [(name.count("."), name) for name, _ in model.named_modules() if name == "score" or name.endswith(".score")]
    if found:
        return model.get_submodule(min(found)[1])  # type: ignore[no-any-return]
    raise ConfigError(
        f"{type(model).__name__} has no `score` head, {WHERE}, use an AutoModelForSequenceClassification whose head "
        "scores every position (GenericForSequenceClassification: Llama, Qwen2/3, Mistral, Gemma 2, ...)"
    )


def packed_rewards(model: Any, batch: dict[str, Any], pad_token_id: int | None) -> PairScores:
    """Run `model` once on a packed preference batch and read each sequence's reward (`pair_scores`)."""
    captured: list[torch.Tensor] = []
    handle = _score_head(model).register_forward_hook(lambda _m, _a, out: captured.append(out))
    kwargs = {k: batch[k] for k in MODEL_KEYS if batch.get(k) is not None}
    prefix = kwargs.get(KEY)
    shared = isinstance(prefix, torch.Tensor) and bool((prefix >= 0).any())
    if shared:
        setattr(prefix, SEEN, False)
    try:
        model(**kwargs, use_cache=False)
    finally:
        handle.remove()
    if shared and not getattr(prefix, SEEN, False):
        raise ConfigError(
            "a shared-prompt pack whose prefix_segment no attn_implementation='packtool' layer attended with "
            "(eager, sdpa and flash_attention_2 ignore it: the rejected completion would not see its prompt), "
            f"{WHERE}, load the model with attn_implementation='packtool' (import packtool.hf)"
        )
    tokens = batch["input_ids"].numel()
    if len(captured) != 1 or captured[0].numel() != tokens:
        raise ConfigError(
            f"the `score` head ran {len(captured)} time(s) and not once over the {tokens} tokens of the row, {WHERE}, "
            "use a num_labels=1 GenericForSequenceClassification model (its head scores every position)"
        )
    scores = pair_scores(captured[0], batch, pad_token_id=pad_token_id)
    if not scores.pair_ids.numel():
        raise ConfigError(f"a batch without a single pair, {WHERE}, pass packs of a preference pack store")
    return scores


class PackedRewardTrainer(RewardTrainer):  # type: ignore[misc]
    """`RewardTrainer` over packtool preference packs (module docstring): TRL's loss and metrics on packed forwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) < 3 and kwargs.get("data_collator") is None:
            kwargs["data_collator"] = RewardPackCollator()
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        first = next(iter(dataset))
        if "pair_ids" not in first:
            raise ConfigError(
                f"the {dataset_name} dataset has no pair_ids (not preference packs), {WHERE}, pass one row per pack "
                "of a preference pack store (packtool.hf.dpo.packs_dataset), or use trl.RewardTrainer on records"
            )
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:  # type: ignore[has-type]
            self._signature_columns = list(dict.fromkeys([*PACK_KEYS, UNPADDED, MARGIN]))

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        mode = "train" if self.model.training else "eval"
        config = self.accelerator.unwrap_model(model).config.get_text_config()
        scores = packed_rewards(model, inputs, config.pad_token_id)
        longest = int(torch.cat([scores.chosen_tokens, scores.rejected_tokens]).max()) if scores.pair_ids.numel() else 0
        if self.args.max_length is not None and longest > self.args.max_length:
            raise ConfigError(
                f"a sequence of {longest} tokens is longer than max_length {self.args.max_length}, {WHERE}, TRL's "
                "RewardTrainer drops such pairs while packs keep every pair: pass RewardConfig(max_length=None)"
            )
        rewards_chosen, rewards_rejected = scores.chosen, scores.rejected
        delta = rewards_chosen - rewards_rejected
        if inputs.get(MARGIN) is not None:
            # one margin per segment: each pair's is its chosen sequence's (float32 as TRL's collator makes it)
            per_segment = inputs[MARGIN].reshape(-1).to(delta.device)
            chosen_segments = _chosen_segments(inputs, scores)
            delta = delta - per_segment.index_select(0, chosen_segments)
        loss = -F.logsigmoid(delta).mean()
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)

        if mode == "train":
            tokens = scores.chosen_tokens.sum() + scores.rejected_tokens.sum()  # TRL: its attention_mask's sum
            self._total_train_tokens += self.accelerator.gather_for_metrics(tokens).sum().item() // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        logits = torch.cat([rewards_chosen, rewards_rejected])[:, None]
        with torch.no_grad():
            all_rewards = self.accelerator.gather(logits)
            self._metrics[mode]["min_reward"].append(all_rewards.min().item())
            self._metrics[mode]["mean_reward"].append(all_rewards.mean().item())
            self._metrics[mode]["max_reward"].append(all_rewards.max().item())
            accuracy = (rewards_chosen > rewards_rejected).float().mean()
            self._metrics[mode]["accuracy"].append(self.accelerator.gather_for_metrics(accuracy).mean().item())
            margin = (rewards_chosen - rewards_rejected).mean()
            self._metrics[mode]["margin"].append(self.accelerator.gather_for_metrics(margin).mean().item())
        outputs = SequenceClassifierOutputWithPast(logits=logits)
        return (loss, outputs) if return_outputs else loss


def _chosen_segments(batch: dict[str, Any], scores: PairScores) -> torch.Tensor:
    """The segment of each pair's chosen sequence (its last token's position, looked up in `cu_seqlens`)."""
    cu = torch.as_tensor(batch.get("cu_seqlens", batch.get("cu_seq_lens_q"))).reshape(-1).to(scores.chosen.device)
    return torch.searchsorted(cu.to(torch.int64), scores.chosen_position, right=True) - 1
