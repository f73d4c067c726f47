"""TRL 1.16's `DPOTrainer` on packtool preference packs: `PackedDPOTrainer`, every `loss_type`, exact.

    import packtool.hf
    from packtool.hf.dpo import PackedDPOTrainer, PreferencePackCollator, packs_dataset
    packs = packs_dataset("packs/", size=4096)       # one row per pack of a preference pack store
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="packtool")
    trainer = PackedDPOTrainer(model=model, args=DPOConfig(..., remove_unused_columns=False, max_length=None),
                               train_dataset=packs, data_collator=PreferencePackCollator(), processing_class=tok)

`packs` is a `datasets.Dataset` with one row per pack (`PackedDataset` items of a preference pack
store: input_ids, labels, position_ids, cu_seqlens, pair_ids, chosen, and prefix_segment when the
store holds each prompt once). `PreferencePackCollator` flattens a batch of packs into one
`[1, T]` row (the `PackedCollator(keys=HF_KEYS)` layout plus the pair keys). The trainer runs the
policy and the reference model ONCE on that row under attn_implementation="packtool" (the
shared-prompt layout included), scores only the target rows (`logits_to_keep`), and lays the
per-token log-probs, entropies, mean logits and top-1 hits out as TRL's padded `[2B, L - 1]`
tensors (chosen rows first, then rejected, each sequence from its first position), with TRL's
`completion_mask` / `attention_mask`. Then TRL's own `_compute_loss` runs unchanged: every
`loss_type` (and `loss_weights`, `ld_alpha`, `use_weighting`, `f_divergence_type`) and every
metric is TRL's code on the same numbers as its padded batch (tests/interop/test_trl_dpo.py).

`precompute_ref_log_probs=True`: the reference log-probs are computed once per pack and added to the
dataset as `ref_chosen_logps` / `ref_rejected_logps` (one list per pack, its pairs in order of first
appearance); `packs.save_to_disk(...)` stores them beside the packs for the next run, and the
reference model is not needed during training. Not supported: PEFT without a `ref_model` and
without precompute (TRL then runs the policy itself as reference outside this hook), vision datasets.
Torch side: imports trl; `import packtool` never imports this module.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from trl import DPOTrainer

from packtool.errors import ConfigError
from packtool.hf.shared_prompt import KEY, SEEN
from packtool.loss import IGNORE_INDEX, PairTargets, pair_groups, pair_targets

#: the keys a pack row carries (prefix_segment only in a shared-prompt store)
PACK_KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens", "pair_ids", "chosen", "prefix_segment")
#: columns PackedDPOTrainer adds with precompute_ref_log_probs=True (one list per pack, its pairs in order)
REF_KEYS = ("ref_chosen_logps", "ref_rejected_logps")
#: what `model(**batch)` gets of a collated batch
MODEL_KEYS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
              "prefix_segment")  # fmt: skip
WHERE = "packtool.hf.dpo"


def packs_dataset(packs: Any, **kwargs: Any) -> Any:
    """A `datasets.Dataset`, one row per pack, of a preference pack store: `packs` is its directory (opened as
    `PackedDataset(packs, **kwargs)`) or any sequence of `PackedDataset` items. Keeps `PACK_KEYS` as lists."""
    import datasets

    if isinstance(packs, (str, Path)):
        from packtool.loader import PackedDataset

        packs = PackedDataset(packs, **kwargs)
    rows = []
    for i in range(len(packs)):
        item = packs[i]
        if item.get("pair_ids") is None:
            raise ConfigError(
                f"pack {i} has no pair_ids (not a preference pack store), {WHERE}, pack a preference token store "
                "(packtool tokenize --format preference, then packtool pack)"
            )
        rows.append({k: _plain(item[k]) for k in PACK_KEYS if item.get(k) is not None})
    return datasets.Dataset.from_list(rows)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


class PreferencePackCollator:
    """Packs (dicts of lists or tensors with item-local `cu_seqlens`) -> one flattened `[1, T]` batch.

    Offsets `cu_seqlens` and `prefix_segment` to the batch; emits `cu_seq_lens_q/_k`, `max_length_q/_k`
    (what `model(**batch)` reads), `cu_seqlens`, `pair_ids`, `chosen` and, shared, `prefix_segment`.
    """

    def __call__(self, packs: list[dict[str, Any]]) -> dict[str, Any]:
        if not packs:
            raise ConfigError(f"an empty batch of packs, {WHERE}, pass at least one pack")
        shared = [p.get("prefix_segment") is not None for p in packs]
        if any(shared) and not all(shared):
            raise ConfigError(f"packs of both layouts in one batch, {WHERE}, train on one pack store at a time")

        def cat(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.cat([torch.as_tensor(p[key], dtype=dtype).reshape(-1) for p in packs])

        cu_parts, pre_parts, tokens, segments = [torch.zeros(1, dtype=torch.int64)], [], 0, 0
        for p in packs:
            cu = torch.as_tensor(p["cu_seqlens"], dtype=torch.int64).reshape(-1)
            cu_parts.append(cu[1:] + tokens)
            if shared[0]:
                pre = torch.as_tensor(p["prefix_segment"], dtype=torch.int64).reshape(-1)
                pre_parts.append(torch.where(pre >= 0, pre + segments, pre))
            tokens += int(cu[-1])
            segments += cu.numel() - 1
        cu_all = torch.cat(cu_parts)
        cu32 = cu_all.to(torch.int32)
        longest = int(torch.diff(cu_all).max()) if cu_all.numel() > 1 else 0
        batch: dict[str, Any] = {
            "input_ids": cat("input_ids", torch.int64)[None],
            "labels": cat("labels", torch.int64)[None],
            "position_ids": cat("position_ids", torch.int64)[None],
            "cu_seqlens": cu32,
            "cu_seq_lens_q": cu32,
            "cu_seq_lens_k": cu32,
            "max_length_q": longest,
            "max_length_k": longest,
            "pair_ids": cat("pair_ids", torch.int64),
            "chosen": cat("chosen", torch.bool),
        }
        if shared[0]:
            batch["prefix_segment"] = torch.cat(pre_parts)
        for key in ("ref_chosen_logps", "ref_rejected_logps"):
            if all(p.get(key) is not None for p in packs):
                batch[key] = cat(key, torch.float64)
        if batch["input_ids"].shape[1] != tokens:
            raise ConfigError(f"a pack's cu_seqlens does not cover its tokens, {WHERE}, pass PackedDataset items")
        return batch


class _Padded:
    """Where each target of a packed batch sits in TRL's padded `[2B, L]` batch (chosen rows, then rejected)."""

    def __init__(self, batch: dict[str, Any]) -> None:
        targets: PairTargets = pair_targets(batch)
        labels = batch["labels"].reshape(-1)
        dev = labels.device
        cu = batch["cu_seqlens"].to(device=dev, dtype=torch.int64)
        pair_ids = batch["pair_ids"].to(dev)
        chosen = batch["chosen"].to(dev)
        n = cu.numel() - 1
        lens = torch.diff(cu)
        prefix = batch.get("prefix_segment")
        pre = (
            torch.full((n,), -1, dtype=torch.int64, device=dev)
            if prefix is None
            else prefix.to(device=dev, dtype=torch.int64)
        )
        prompt = targets.prompt.to(dev)
        real = (pair_ids >= 0) & ~prompt
        idx = real.nonzero().reshape(-1)
        uniq, inverse = pair_groups(pair_ids.index_select(0, idx), chosen.index_select(0, idx))  # per occurrence
        first = torch.full((uniq.numel(),), n, dtype=torch.int64, device=dev).scatter_reduce(
            0, inverse, idx, reduce="amin"
        )
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=dev)
        b = uniq.numel()
        row_of_seg = torch.full((n,), -1, dtype=torch.int64, device=dev)
        row_of_seg[idx] = rank.index_select(0, inverse) + torch.where(chosen.index_select(0, idx), 0, b)
        if int(torch.bincount(row_of_seg[idx], minlength=2 * b).max()) != 1 or int(row_of_seg[idx].numel()) != 2 * b:
            raise ConfigError(
                f"a pair without exactly one chosen and one rejected sequence, {WHERE}, batch whole packs"
            )
        pre_len = torch.where(pre >= 0, lens.index_select(0, pre.clamp(min=0)), 0)
        seq_len = torch.zeros(2 * b, dtype=torch.int64, device=dev)
        seq_len[row_of_seg[idx]] = lens.index_select(0, idx) + pre_len.index_select(0, idx)
        length = int(seq_len.max()) if b else 1
        # every labelled token of a sequence (TRL's completion_mask, its first position included)
        seg = torch.repeat_interleave(torch.arange(n, device=dev), lens)
        pos = torch.arange(labels.numel(), device=dev) - cu.index_select(0, seg) + pre_len.index_select(0, seg)
        labelled = (labels != IGNORE_INDEX) & (row_of_seg.index_select(0, seg) >= 0)
        completion = torch.zeros(2 * b, length, dtype=torch.int64, device=dev)
        completion[row_of_seg.index_select(0, seg)[labelled], pos[labelled]] = 1
        self.completion_mask = completion
        self.attention_mask = (torch.arange(length, device=dev)[None] < seq_len[:, None]).to(torch.int64)
        # each target (pair_targets' order: token order) is predicted at column (its position in its sequence) - 1
        token = torch.arange(labels.numel(), device=dev)
        start = token == cu.index_select(0, seg)
        predicted = ~start | (start & (pre.index_select(0, seg) >= 0) & (pre_len.index_select(0, seg) > 0))
        keep = ((labels != IGNORE_INDEX) & predicted).nonzero().reshape(-1)
        self.rows = row_of_seg.index_select(0, seg.index_select(0, keep))
        self.cols = pos.index_select(0, keep) - 1
        self.shape = (2 * b, max(length - 1, 0))
        self.targets = targets
        self.pairs = b
        if keep.numel() != targets.predictor.numel():
            raise RuntimeError("packtool.hf.dpo: the padded view and pair_targets disagree")

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), values)


class _Scorer:
    """Stands in for a model inside TRL's `_compute_loss`: runs the real one on the packed batch."""

    def __init__(self, model: Any, batch: dict[str, Any], padded: _Padded) -> None:
        self.model, self.batch, self.padded = model, batch, padded

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        p = self.padded
        model_kwargs = {k: self.batch[k] for k in MODEL_KEYS if self.batch.get(k) is not None}
        if kwargs.get("output_router_logits"):
            model_kwargs["output_router_logits"] = True
        rows = p.targets.predictor.to(self.batch["input_ids"].device)
        prefix = model_kwargs.get(KEY)
        shared = isinstance(prefix, torch.Tensor) and bool((prefix >= 0).any())
        if shared:
            setattr(prefix, SEEN, False)  # this forward must attend with it (the policy and the reference alike)
        out = self.model(**model_kwargs, use_cache=False, logits_to_keep=rows)
        if shared and not getattr(prefix, SEEN, False):
            raise ConfigError(
                "a shared-prompt pack whose prefix_segment no attn_implementation='packtool' layer attended with "
                "(eager, sdpa and flash_attention_2 ignore it: the rejected completion would not see its prompt), "
                f"{WHERE}, load the model and the reference model with attn_implementation='packtool' "
                "(import packtool.hf; model.set_attn_implementation('packtool'))"
            )
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        logp_all = torch.log_softmax(logits, -1)
        target = p.targets.target.to(logits.device)[:, None]
        log_probs = logp_all.gather(1, target).reshape(-1)
        with torch.no_grad():
            probs = logp_all.exp()
            entropy = -(probs * logp_all).sum(-1)
            mean_logits = logits.mean(-1)
            is_top1 = logits.argmax(-1) == target.reshape(-1)
            log_sum_sq = torch.logsumexp(2 * logp_all, -1)
        return SimpleNamespace(
            log_probs=p.scatter(log_probs),
            entropy=p.scatter(entropy),
            mean_logits=p.scatter(mean_logits),
            is_top1=p.scatter(is_top1),
            log_sum_sq_probs=p.scatter(log_sum_sq),
            aux_loss=getattr(out, "aux_loss", None),
            logits=out.logits,
        )


class PackedDPOTrainer(DPOTrainer):  # type: ignore[misc]
    """`DPOTrainer` over packtool preference packs (module docstring): TRL's loss code on packed forwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.ref_model is None and not self.precompute_ref_logps:
            raise ConfigError(
                f"no reference model (PEFT without ref_model), {WHERE}, pass ref_model= (a frozen copy of the model) "
                "or precompute_ref_log_probs=True"
            )

    def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
        """Reference log-probs once per pack: columns `ref_chosen_logps` / `ref_rejected_logps`, one list per pack
        (its pairs in order of first appearance), computed with the reference model (the initial policy when no
        ref_model is given). `dataset.save_to_disk` keeps them beside the packs."""
        model: Any = self.ref_model or self.model  # type: ignore[has-type]
        device = self.accelerator.device
        collate = PreferencePackCollator()
        chosen: list[list[float]] = []
        rejected: list[list[float]] = []
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for row in dataset:
                batch = collate([{k: row[k] for k in PACK_KEYS if row.get(k) is not None}])
                batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                padded = _Padded(batch)
                out = _Scorer(model, batch, padded)()
                sums = out.log_probs.sum(1)
                chosen.append(sums[: padded.pairs].double().cpu().tolist())
                rejected.append(sums[padded.pairs :].double().cpu().tolist())
        model.train(was_training)
        for column in ("ref_chosen_logps", "ref_rejected_logps"):
            if column in dataset.column_names:
                dataset = dataset.remove_columns(column)
        return dataset.add_column("ref_chosen_logps", chosen).add_column("ref_rejected_logps", rejected)

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        first = next(iter(dataset))
        if "pair_ids" not in first:
            raise ConfigError(
                f"the {dataset_name} dataset has no pair_ids (not preference packs), {WHERE}, pass one row per pack "
                "of a preference pack store (PackedDataset items), or use trl.DPOTrainer on unpacked records"
            )
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:  # type: ignore[has-type]
            self._signature_columns = list(PACK_KEYS + REF_KEYS)

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        padded = _Padded(inputs)
        view = {
            "input_ids": padded.completion_mask.new_zeros(padded.completion_mask.shape),
            "attention_mask": padded.attention_mask,
            "completion_mask": padded.completion_mask,
        }
        if self.precompute_ref_logps:
            for key in ("ref_chosen_logps", "ref_rejected_logps"):
                if inputs.get(key) is None or inputs[key].numel() != padded.pairs:
                    raise ConfigError(
                        f"the batch has no {key} for its {padded.pairs} pairs, {WHERE}, let PackedDPOTrainer "
                        "precompute them (precompute_ref_log_probs=True) on this dataset"
                    )
                view[key] = inputs[key]
            return super()._compute_loss(_Scorer(model, inputs, padded), view, return_outputs)
        saved = self.ref_model  # type: ignore[has-type]
        self.ref_model = _Scorer(saved, inputs, padded)
        try:
            return super()._compute_loss(_Scorer(model, inputs, padded), view, return_outputs)
        finally:
            self.ref_model = saved
