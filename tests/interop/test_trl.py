"""TRL 1.16 reads `--to trl` exports with its own code: padding-free collator batches == packtool's loader.

Every pack of every store goes through `datasets.load_dataset("parquet")` and TRL's
`DataCollatorForLanguageModeling(padding_free=True)` (what `SFTTrainer` builds for
`SFTConfig(padding_free=True)`), in batches of 4, and must equal `PackedCollator(flatten=True)`
over the same packs: input_ids, labels, position_ids, cu_seq_lens, max_length. Then two
`SFTTrainer` steps on a tiny Llama (CPU) consume the export unmodified, and every batch its
dataloader yields is the loader's batch for the same packs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _stores import SAMPLE, batches, build_stores, export

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

from packtool.loader import PackedCollator, PackedDataset  # noqa: E402

STORES = ["chat", "prompt_completion", "text", "u32"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    return build_stores(tmp_path_factory.mktemp("trl_stores"))


def _load(out: Path, size: int):
    return datasets.load_dataset("parquet", data_files=str(out / f"training_{size}.parquet"), split="train")


@pytest.mark.parametrize("name", STORES)
def test_trl_collator_equals_packtool_loader_for_every_pack(stores, tmp_path: Path, name: str) -> None:
    store = stores[name]
    ds = _load(export(store, "trl", tmp_path / "trl"), store.size)
    packed = PackedDataset(store.pack_dir, size=store.size)
    assert len(ds) == len(packed) > 0
    trl_collate = DataCollatorForLanguageModeling(pad_token_id=store.pad_id, padding_free=True)
    ours = PackedCollator(flatten=True)
    for idx in batches(len(packed), 4):
        got = trl_collate([ds[i] for i in idx])
        want = ours(packed.__getitems__(idx))
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(got[key], want[key]), (name, idx, key)
        assert torch.equal(got["cu_seq_lens_q"], want["cu_seqlens"]), (name, idx)
        assert torch.equal(got["cu_seq_lens_k"], want["cu_seq_lens_k"])
        assert got["max_length_q"] == want["max_length_q"] == want["max_seqlen"]
        assert int((got["labels"] != -100).sum()) == want["n_target_tokens"]


def test_sft_trainer_two_steps_on_the_export(stores, tmp_path: Path) -> None:
    """`SFTTrainer` with the SFTConfig lines `packtool export` prints: it trains, and sees the loader's batches."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    store = stores["chat"]
    ds = _load(export(store, "trl", tmp_path / "trl"), store.size)
    tokenizer = AutoTokenizer.from_pretrained(SAMPLE / "tokenizer")
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=store.vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=store.size,
            pad_token_id=store.pad_id,
        )
    )
    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        packing=False,
        padding_free=True,
        max_length=None,
        dataset_kwargs={"skip_prepare_dataset": True},
        per_device_train_batch_size=2,
        max_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    assert trainer.data_collator.padding_free

    packed = PackedDataset(store.pack_dir, size=store.size)
    row_of = {bytes(np.asarray(packed[i]["input_ids"])): i for i in range(len(packed))}
    ours = PackedCollator(flatten=True)
    seen = 0
    for seen, batch in enumerate(trainer.get_train_dataloader(), 1):
        rows = batch["input_ids"].reshape(-1, store.size)
        idx = [row_of[bytes(r.numpy())] for r in rows]
        want = ours(packed.__getitems__(idx))
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(batch[key], want[key]), key
        assert torch.equal(batch["cu_seq_lens_q"], want["cu_seqlens"])
        if seen == 2:
            break
    assert seen == 2
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert result.global_step == 2 and len(losses) == 2
    assert all(np.isfinite(losses)) and all(0 < x < 20 for x in losses)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_collated_packs_keep_sequences_apart_without_flash_attention(stores, tmp_path: Path, attn: str) -> None:
    """What the printed TRL line claims for CPU kernels: with `use_cache=False` (as `SFTTrainer` calls the model),
    transformers finds the sequences in `position_ids`, so each sequence's logits equal those of it alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    store = stores["prompt_completion"]
    ds = _load(export(store, "trl", tmp_path / "trl"), store.size)
    batch = DataCollatorForLanguageModeling(pad_token_id=store.pad_id, padding_free=True)([ds[0], ds[1]])
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=store.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=store.size)
    config._attn_implementation = attn
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        cu = batch["cu_seq_lens_q"].tolist()
        for s, e in list(zip(cu[:-1], cu[1:], strict=True))[:12]:
            alone = model(input_ids=batch["input_ids"][:, s:e], use_cache=False).logits
            assert torch.allclose(packed[:, s:e], alone, atol=1e-4), (attn, s, e)
