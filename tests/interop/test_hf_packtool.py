"""`attn_implementation="packtool"` under the trainers users run (docs/HF.md's recipes, as written):
TRL 1.16's `SFTTrainer(padding_free=True)` on a `packtool export trl` dataset, and `transformers.Trainer`
over `PackedDataset` + `PackedCollator(flatten=True, keys=HF_KEYS)`. A few CPU steps each; the loss of the
first step (the model's own loss on the batch the trainer built) equals the loss of the same documents
as a padded batch (one document per row, `attention_mask`) under eager with the same weights."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from _stores import SAMPLE, build_stores, export

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

import packtool.hf  # noqa: E402, F401  registers attn_implementation="packtool"
from packtool.loader import HF_KEYS, PackedCollator, PackedDataset  # noqa: E402


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    return build_stores(tmp_path_factory.mktemp("hf_stores"))


def tiny_model(vocab: int, size: int, pad_id: int):
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=size,
                                      pad_token_id=pad_id)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="packtool")


class FirstStep:
    """Records the first batch the trainer feeds the model and the loss the model returns for it."""

    def __init__(self, model) -> None:
        self.batch: dict | None = None
        self.loss: float | None = None
        model.register_forward_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs, output) -> None:
        if self.batch is None:
            self.batch = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in kwargs.items()}
            self.loss = float(output.loss)


def padded_reference_loss(initial, batch: dict) -> float:
    """The same documents, one per row, right-padded with an attention_mask, under eager attention."""
    model = copy.deepcopy(initial)
    model.set_attn_implementation("eager")
    cu = batch["cu_seq_lens_q"].tolist()
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    spans = [(a, b) for a, b in zip(cu[:-1], cu[1:], strict=True) if b > a]
    width = max(b - a for a, b in spans)
    rows = torch.zeros(len(spans), width, dtype=torch.long)
    mask = torch.zeros_like(rows)
    targets = torch.full_like(rows, -100)
    for i, (a, b) in enumerate(spans):
        rows[i, : b - a], mask[i, : b - a], targets[i, : b - a] = ids[a:b], 1, labels[a:b]
    with torch.no_grad():
        return float(model(input_ids=rows, attention_mask=mask, labels=targets).loss)


def test_sft_trainer_padding_free_with_packtool_attention(stores, tmp_path: Path) -> None:
    store = stores["chat"]
    out = export(store, "trl", tmp_path / "trl")
    ds = datasets.load_dataset("parquet", data_files=str(out / f"training_{store.size}.parquet"), split="train")
    tokenizer = transformers.AutoTokenizer.from_pretrained(SAMPLE / "tokenizer")
    model = tiny_model(store.vocab_size, store.size, store.pad_id)
    initial = copy.deepcopy(model)
    first = FirstStep(model)
    args = trl.SFTConfig(output_dir=str(tmp_path / "run"), packing=False, padding_free=True, max_length=None,
                         dataset_kwargs={"skip_prepare_dataset": True}, per_device_train_batch_size=2, max_steps=3,
                         logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                         learning_rate=1e-3, seed=0)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    result = trainer.train()
    assert result.global_step == 3
    assert model.config._attn_implementation == "packtool"
    batch = first.batch
    assert batch is not None and "position_ids" in batch and batch["input_ids"].shape[0] == 1  # padding-free row
    assert len(batch["cu_seq_lens_q"]) > 3  # several documents in it
    want = padded_reference_loss(initial, batch)
    assert first.loss == pytest.approx(want, rel=1e-5)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[0] == pytest.approx(want, rel=1e-3, abs=1e-3)  # the logged loss is rounded
    assert all(np.isfinite(losses))


def test_hf_trainer_over_packed_dataset_with_packtool_attention(stores, tmp_path: Path) -> None:
    store = stores["prompt_completion"]
    ds = PackedDataset(store.pack_dir, size=store.size)
    model = tiny_model(store.vocab_size, store.size, store.pad_id)
    initial = copy.deepcopy(model)
    first = FirstStep(model)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=2,
                                          learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[],
                                          use_cpu=True, remove_unused_columns=False, dataloader_num_workers=0, seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds,
                                   data_collator=PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS))
    result = trainer.train()
    assert result.global_step == 3
    batch = first.batch
    assert batch is not None and set(HF_KEYS) <= set(batch) and batch["input_ids"].shape == (1, 2 * store.size)
    want = padded_reference_loss(initial, batch)
    assert first.loss == pytest.approx(want, rel=1e-5)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[0] == pytest.approx(want, rel=1e-3, abs=1e-3)
