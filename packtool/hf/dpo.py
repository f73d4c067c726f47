"""TRL 1.16's `DPOTrainer` on packtool preference packs: `PackedDPOTrainer`, every `loss_type`, exact.

    import packtool.hf
    from packtool.hf.dpo import PackedDPOTrainer, PreferencePackCollator, packs_dataset
    packs = packs_dataset("packs/", size=4096)       # one row per pack of a preference pack store
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="packtool")
    trainer = PackedDPOTrainer(model=model, args=DPOConfig(..., remove_unused_columns=False, max_length=None),
                               train_dataset=packs, data_collator=PreferencePackCollator(), processing_class=tok)

`packs` is a `datasets.Dataset` with one row per pack (`PackedDataset` items of a preference pack
store: input_ids, labels, position_ids, cu_seqlens, cu_seqlens_unpadded, pair_ids, chosen, first_target,
and prefix_segment when the store holds each prompt once). `PreferencePackCollator` flattens a batch of packs into one
`[1, T]` row (the `PackedCollator(keys=HF_KEYS)` layout plus the pair keys). The trainer runs the
policy and the reference model ONCE on that row under attn_implementation="packtool" (the
shared-prompt layout included), scores only the target rows (`logits_to_keep`), and lays the
per-token log-probs, entropies, mean logits and top-1 hits out as TRL's padded `[2B, L - 1]`
tensors (chosen rows first, then rejected, each sequence from its first position), with TRL's
`completion_mask` / `attention_mask`. Then TRL's own `_compute_loss` runs unchanged: every
`loss_type` (and `loss_weights`, `ld_alpha`, `use_weighting`, `f_divergence_type`) and every
metric is TRL's code on the same numbers as its padded batch (tests/interop/test_trl_dpo.py).

`precompute_ref_log_probs=True`: the reference log-probs are computed once per pack and added to the
dataset (`packtool.hf.dpo_ref`: one list per pack, its pairs in order of first appearance, with their pair ids
and `ld_alpha`); `packs.save_to_disk(...)` keeps them beside the packs, and a later run on the saved dataset
with no `ref_model` uses them (never the policy it is given). The reference model is not needed during
training. A mixture-of-experts model's router load-balancing loss is the padded batch's (`packtool.hf.
router_aux`), and `num_tokens` counts what TRL's batch holds (no `--pad-multiple` padding).
Not supported: PEFT without a `ref_model` and without precompute (TRL then runs the policy itself as
reference outside this hook), vision datasets.
Torch side: imports trl; `import packtool` never imports this module.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from trl import DPOTrainer

from packtool.errors import ConfigError
from packtool.hf.dpo_ref import (
    MATCH_KEYS,
    REF_KEYS,
    batch_ref,
    check_pack,
    check_saved,
    has_saved,
    pack_pairs,
    with_columns,
)
from packtool.hf.dpo_view import FIRST, MODEL_KEYS, UNPADDED, PaddedView, Scorer

__all__ = ["MODEL_KEYS", "PACK_KEYS", "REF_KEYS", "PackedDPOTrainer", "PreferencePackCollator", "packs_dataset"]

#: the keys a pack row carries (prefix_segment only in a shared-prompt store; cu_seqlens_unpadded: the segments
#: without their --pad-multiple padding; first_target: a segment's first token is a completion token)
PACK_KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens", UNPADDED, "pair_ids", "chosen", "prefix_segment",
             FIRST)  # fmt: skip
WHERE = "packtool.hf.dpo"


def packs_dataset(packs: Any, **kwargs: Any) -> Any:
    """A `datasets.Dataset`, one row per pack, of a preference pack store: `packs` is its directory (opened as
    `PackedDataset(packs, **kwargs)`) or any sequence of `PackedDataset` items. Keeps `PACK_KEYS` as lists, and
    from a `PackedDataset` each segment's `first_target` (the store's target flag of its first token, which the
    loader's labels drop: TRL's completion_mask holds it when a pair's prompt is empty)."""
    import datasets

    from packtool.loader import PackedDataset

    if isinstance(packs, (str, Path)):
        packs = PackedDataset(packs, **kwargs)
    first = _first_targets(packs) if isinstance(packs, PackedDataset) else None
    rows = []
    for i in range(len(packs)):
        item = packs[i]
        if first is not None:
            flags = first(i)
            tail = len(item["cu_seqlens"]) - 1 - len(flags)
            item = {**item, FIRST: flags + [False] * tail}
        if item.get("pair_ids") is None:
            raise ConfigError(
                f"pack {i} has no pair_ids (not a preference pack store), {WHERE}, pack a preference token store "
                "(packtool tokenize --format preference, then packtool pack)"
            )
        rows.append({k: _plain(item[k]) for k in PACK_KEYS if item.get(k) is not None})
    return datasets.Dataset.from_list(rows)


def _first_targets(ds: Any) -> Any:
    """`pack -> [bool per stored segment]`: the pack store's target flag of each segment's first token."""
    import numpy as np

    from packtool.formats.pack_store import open_pack_split

    store = open_pack_split(ds.directory, ds.split, ds.size)
    offsets = np.asarray(store.pack_offsets, np.int64)
    lens = np.asarray(store.seg_lens, np.int64)
    counts = np.diff(offsets)
    pack = np.repeat(np.arange(counts.size), counts)
    ends = np.cumsum(lens)
    col = ends - lens - np.repeat(np.concatenate(([0], ends))[offsets[:-1]], counts)
    ok = (lens > 0) & (col < store.size)
    flags = np.zeros(lens.size, bool)
    if store.loss is None:
        flags[ok] = True
    else:
        flags[ok] = np.asarray(store.loss)[pack[ok], col[ok]] != 0

    def of(i: int) -> list[bool]:
        return flags[offsets[i] : offsets[i + 1]].tolist()

    return of


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


class PreferencePackCollator:
    """Packs (dicts of lists or tensors with item-local `cu_seqlens`) -> one flattened `[1, T]` batch.

    Offsets `cu_seqlens` (and `cu_seqlens_unpadded`) and `prefix_segment` to the batch; emits `cu_seq_lens_q/_k`,
    `max_length_q/_k` (what `model(**batch)` reads), `cu_seqlens`, `pair_ids`, `chosen`, shared `prefix_segment`,
    and the saved reference columns when every pack has them (each pack's checked against its pairs).
    """

    def __call__(self, packs: list[dict[str, Any]]) -> dict[str, Any]:
        if not packs:
            raise ConfigError(f"an empty batch of packs, {WHERE}, pass at least one pack")
        shared = [p.get("prefix_segment") is not None for p in packs]
        if any(shared) and not all(shared):
            raise ConfigError(f"packs of both layouts in one batch, {WHERE}, train on one pack store at a time")

        def cat(key: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.cat([torch.as_tensor(p[key], dtype=dtype).reshape(-1) for p in packs])

        unpadded = all(p.get(UNPADDED) is not None for p in packs)
        cu_parts, pre_parts, tokens, segments = [torch.zeros(1, dtype=torch.int64)], [], 0, 0
        real_parts, real_tokens = [torch.zeros(1, dtype=torch.int64)], 0
        for p in packs:
            cu = torch.as_tensor(p["cu_seqlens"], dtype=torch.int64).reshape(-1)
            cu_parts.append(cu[1:] + tokens)
            if unpadded:
                cu_real = torch.as_tensor(p[UNPADDED], dtype=torch.int64).reshape(-1)
                if cu_real.shape != cu.shape:
                    raise ConfigError(
                        f"a pack's {UNPADDED} does not match its cu_seqlens, {WHERE}, pass PackedDataset items"
                    )
                real_parts.append(cu_real[1:] + real_tokens)
                real_tokens += int(cu_real[-1])
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
        if unpadded:
            batch[UNPADDED] = torch.cat(real_parts).to(torch.int32)
        if all(p.get(FIRST) is not None for p in packs):
            batch[FIRST] = cat(FIRST, torch.bool)
        if shared[0]:
            batch["prefix_segment"] = torch.cat(pre_parts)
        if all(p.get(key) is not None for p in packs for key in REF_KEYS):
            for i, p in enumerate(packs):
                check_pack(p, i)
            for key in REF_KEYS:
                batch[key] = cat(key, torch.float64)
            if all(p.get("ref_pair_ids") is not None for p in packs):
                batch["ref_pair_ids"] = cat("ref_pair_ids", torch.int64)
        if batch["input_ids"].shape[1] != tokens:
            raise ConfigError(f"a pack's cu_seqlens does not cover its tokens, {WHERE}, pass PackedDataset items")
        return batch


class PackedDPOTrainer(DPOTrainer):  # type: ignore[misc]
    """`DPOTrainer` over packtool preference packs (module docstring): TRL's loss code on packed forwards."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        given = inspect.signature(DPOTrainer.__init__).bind(None, *args, **kwargs).arguments
        config = given.get("args")
        train = given.get("train_dataset")
        if train is not None and hasattr(train, "__len__") and len(train) == 0:
            raise _no_packs("train")  # (TRL's constructor reads its first row)
        if given.get("ref_model") is None and not getattr(config, "precompute_ref_log_probs", False):
            sets = given.get("eval_dataset")
            named = {"train": given.get("train_dataset"), **(sets if isinstance(sets, dict) else {"eval": sets})}
            for name, dataset in named.items():
                if has_saved(dataset, name):
                    raise ConfigError(
                        f"the {name} dataset carries saved reference log-probs ({REF_KEYS[0]}) but there is no "
                        f"ref_model and precompute_ref_log_probs=False: TRL would take this policy as the reference "
                        f"and ignore them, {WHERE}, pass precompute_ref_log_probs=True to train against the saved "
                        "ones, or remove the columns (dataset.remove_columns) to take this model as the reference"
                    )
        self._step_pairs: tuple[int, int] | None = None  # (pairs in this optimizer step, micro-batches)
        # TRL builds a reference from the policy's checkpoint when none is given (and under FSDP even with
        # precompute): only one the user passed may replace saved reference log-probs
        self._ref_given = given.get("ref_model") is not None
        arguments = {k: v for k, v in given.items() if k != "self"}
        if arguments.get("data_collator") is None:  # TRL's own would look for prompt_ids
            arguments["data_collator"] = PreferencePackCollator()
        super().__init__(**arguments)
        if self.ref_model is None and not self.precompute_ref_logps:  # type: ignore[has-type]
            raise ConfigError(
                f"no reference model (PEFT without ref_model), {WHERE}, pass ref_model= (a frozen copy of the model) "
                "or precompute_ref_log_probs=True"
            )

    def _precompute_ref_logps(self, dataset: Any, name: str, batch_size: int) -> Any:
        """Reference log-probs once per pack (`packtool.hf.dpo_ref`'s columns), computed by TRL's own
        `compute_ref_log_probs` on the packed forward of the reference model (the initial policy when no ref_model
        is given). A dataset that already carries them (a saved run's) keeps them when no ref_model is given:
        the model is then no reference. `dataset.save_to_disk` keeps them beside the packs."""
        if has_saved(dataset, name) and not self._ref_given:
            check_saved(dataset, name, self.ld_alpha)
            return dataset
        model: Any = self.ref_model or self.model  # type: ignore[has-type]
        device = self.accelerator.device
        collate = PreferencePackCollator()
        chosen: list[list[float]] = []
        rejected: list[list[float]] = []
        pair_ids: list[list[int]] = []
        was_training = model.training
        model.eval()
        try:
            for row in dataset:
                batch = collate([{k: row[k] for k in PACK_KEYS if row.get(k) is not None}])
                batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                view = PaddedView(batch)
                ref_c, ref_r = self.compute_ref_log_probs(Scorer(model, batch, view), _trl_inputs(view))
                chosen.append(ref_c.double().cpu().tolist())
                rejected.append(ref_r.double().cpu().tolist())
                pair_ids.append(view.pair_ids.cpu().tolist())
        finally:
            model.train(was_training)
        return with_columns(dataset, chosen, rejected, pair_ids, self.ld_alpha)

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        first = next(iter(dataset), None)
        if first is None:
            raise _no_packs(dataset_name)
        if "pair_ids" not in first:
            raise ConfigError(
                f"the {dataset_name} dataset has no pair_ids (not preference packs), {WHERE}, pass one row per pack "
                "of a preference pack store (PackedDataset items), or use trl.DPOTrainer on unpacked records"
            )
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:  # type: ignore[has-type]
            self._signature_columns = list(PACK_KEYS + REF_KEYS + MATCH_KEYS)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        """Trainer's micro-batches of one optimizer step, and how many pairs they hold (all processes)."""
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        local = torch.tensor([sum(pack_pairs(b)[0] for b in batches)], device=device)
        total = int(self.accelerator.gather(local).sum()) if self.accelerator.num_processes > 1 else int(local)
        self._step_pairs = (total, len(batches))
        return batches, items

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:
            self._step_pairs = None

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:  # fmt: skip
        """TRL's loss of the micro-batch, weighted by its share of the optimizer step's pairs: TRL's micro-batches
        hold equal pair counts, so averaging them (Trainer divides by the accumulation steps, DDP by the
        processes) is its mean over the step's pairs; packs hold unequal counts, which would weigh a pair of a
        small micro-batch more. Outside training (evaluation, a direct call) the loss is TRL's as it is."""
        out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self._step_pairs is None or not self.model.training:
            return out
        total, micro = self._step_pairs
        scale = pack_pairs(inputs)[0] * micro * self.accelerator.num_processes / max(total, 1)
        return (out[0] * scale, out[1]) if return_outputs else out * scale

    def _compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool) -> Any:
        view = PaddedView(inputs)
        limit = self.args.max_length
        if limit is not None and view.longest > limit:
            raise ConfigError(
                f"a sequence of the batch holds {view.longest} tokens (prompt + completion), more than DPOConfig "
                f"max_length={limit}: TRL would cut it ({self.args.truncation_mode}), the packs hold it whole, "
                f"{WHERE}, pass max_length=None (the pack store decides the lengths)"
            )
        counting = sorted({"ipo", "sigmoid_norm"} & set(self.loss_types))
        if counting and view.unsure_first:
            raise ConfigError(
                f"loss_type {counting[0]} divides by TRL's completion lengths, which count a sequence's first token "
                "when its prompt is empty, and this batch has sequences whose targets start at their second token "
                f"without first_target to say whether the first one is a target, {WHERE}, make the dataset with "
                "packs_dataset(PACK_DIR, size=N) (it reads first_target from the pack store)"
            )
        padded = _trl_inputs(view)
        if self.precompute_ref_logps:
            padded.update(batch_ref(inputs, view.pair_ids))
            return super()._compute_loss(Scorer(model, inputs, view), padded, return_outputs)
        saved = self.ref_model  # type: ignore[has-type]
        self.ref_model = Scorer(saved, inputs, view)
        try:
            return super()._compute_loss(Scorer(model, inputs, view), padded, return_outputs)
        finally:
            self.ref_model = saved


def _no_packs(name: str) -> ConfigError:
    return ConfigError(
        f"the {name} dataset has no packs, {WHERE}, pass packs_dataset(PACK_DIR, size=N) of a non-empty preference "
        "pack store"
    )


def _trl_inputs(view: PaddedView) -> dict[str, torch.Tensor]:
    """The keys TRL's `_compute_loss` / `compute_ref_log_probs` read of its padded batch (ids are never read)."""
    return {
        "input_ids": view.completion_mask.new_zeros(view.completion_mask.shape),
        "attention_mask": view.attention_mask,
        "completion_mask": view.completion_mask,
    }
