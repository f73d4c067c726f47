"""Exact in the model: a tiny random `Qwen2VLForConditionalGeneration` fed a packed vision batch
(`PackedCollator(flatten=True, keys=HF_KEYS)`: pixels, grids, `position_ids` [4, 1, T], `cu_seq_lens_*`) under
`attn_implementation="packtool"` gives each record's logits and gradients as the model gives them for that
record alone, computing its own M-RoPE positions (`get_rope_index`) from `mm_token_type_ids` (float64)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from vision_support import IMG, VEND, VSTART, make_vision_store, random_docs

from packtool.loader import PackedDataset
from packtool.loader.collator import HF_KEYS, PackedCollator
from packtool.stages.pack import PackConfig, pack_store

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402, F401  (registers attn_implementation="packtool")


def tiny_qwen2_vl() -> object:
    return transformers.Qwen2VLConfig(
        text_config={
            "vocab_size": 600,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
            "max_position_embeddings": 512,
            "bos_token_id": None,
            "eos_token_id": None,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2},
        image_token_id=IMG,
        vision_start_token_id=VSTART,
        vision_end_token_id=VEND,
        video_token_id=596,
    )


@pytest.mark.parametrize(
    "attn", ["packtool", pytest.param({"text_config": "packtool", "vision_config": "sdpa"}, marks=pytest.mark.slow)]
)
def test_packed_vision_batch_equals_each_record_alone(tmp_path: Path, attn: object) -> None:
    torch.manual_seed(0)
    store = make_vision_store(tmp_path / "s", random_docs(12, seed=5, max_text=30))
    res = pack_store(PackConfig(store, 200, tmp_path / "p"))
    ds = PackedDataset(res.directory, size=200)
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
    assert batch["position_ids"].shape == (4, 1, 400) and batch["image_grid_thw"].shape[0] >= 4
    config = tiny_qwen2_vl()
    model = transformers.Qwen2VLForConditionalGeneration(copy.deepcopy(config)).double()
    model.set_attn_implementation(attn)
    ref = transformers.Qwen2VLForConditionalGeneration(copy.deepcopy(config)).double()  # its own config object
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    assert model.model.language_model.config._attn_implementation == "packtool"
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs["pixel_values"] = inputs["pixel_values"].double()
    logits = model(**inputs).logits[0]
    cu = batch["cu_seq_lens_q"].tolist()
    ids, pixels, grids = batch["input_ids"][0], inputs["pixel_values"], batch["image_grid_thw"]
    real = ids != ds.pad_id
    g = r = 0
    packed_loss, alone_loss, worst = logits.new_zeros(()), logits.new_zeros(()), 0.0
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        seg = ids[a:e]
        if not bool(real[a:e].any()):
            continue  # tail padding
        k = int(((seg == IMG).int().diff(prepend=seg.new_zeros(1, dtype=torch.int32)) == 1).sum())
        n = int(grids[g : g + k].prod(-1).sum()) if k else 0
        extra = {"pixel_values": pixels[r : r + n], "image_grid_thw": grids[g : g + k]} if k else {}
        alone = ref(input_ids=seg[None], mm_token_type_ids=(seg == IMG).long()[None], **extra).logits[0]
        worst = max(worst, float((alone - logits[a:e]).detach().abs().max()))
        weight = torch.linspace(0.5, 1.5, e - a, dtype=torch.float64)[:, None]
        packed_loss = packed_loss + (logits[a:e] * weight).sum()
        alone_loss = alone_loss + (alone * weight).sum()
        g, r = g + k, r + n
    assert g == grids.shape[0] and r == pixels.shape[0]  # every image used, in order
    assert worst < 1e-9
    with torch.no_grad():  # without cu_seq_lens the attention separates documents by row 0 of [4, 1, T] alone
        only = {k: inputs[k] for k in ("input_ids", "position_ids", "pixel_values", "image_grid_thw")}
        assert float((model(**only).logits[0] - logits).abs().max()) < 1e-12
    packed_loss.backward()
    alone_loss.backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.allclose(p.grad, grads[name], atol=1e-9, rtol=1e-7), name


def tiny_gemma3() -> object:
    small = {"vocab_size": 600, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256, "pad_token_id": 1,
             "bos_token_id": None, "eos_token_id": None}  # fmt: skip
    text = transformers.Gemma3TextConfig(**small, num_hidden_layers=2, sliding_window=6, query_pre_attn_scalar=8,
                                         layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=16, patch_size=4)  # fmt: skip
    return transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                     image_token_index=IMG, boi_token_index=595, eoi_token_index=594)  # fmt: skip


def test_gemma3_packed_store_equals_each_record_alone(tmp_path: Path) -> None:
    """Gemma 3 through the store, the packer and the loader: token_type_ids per item, pixels [k, 3, 16, 16],
    bidirectional image blocks inside causal documents (sliding layers included) exact under "packtool"."""
    from vision_support import gemma_docs, make_gemma_store

    torch.manual_seed(0)
    store = make_gemma_store(tmp_path / "s", gemma_docs(10, seed=4))
    res = pack_store(PackConfig(store, 96, tmp_path / "p"))
    ds = PackedDataset(res.directory, size=96)
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
    assert set(batch) == {*HF_KEYS, "pixel_values", "token_type_ids"} and batch["position_ids"].shape == (1, 192)
    assert torch.equal(batch["token_type_ids"], (batch["input_ids"] == IMG).long())
    model = transformers.Gemma3ForConditionalGeneration(tiny_gemma3()).double().eval()
    model.set_attn_implementation("packtool")
    ref = transformers.Gemma3ForConditionalGeneration(tiny_gemma3()).double().eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs["pixel_values"] = inputs["pixel_values"].double()
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0]
    ids, pixels = batch["input_ids"][0], inputs["pixel_values"]
    cu, r, worst = batch["cu_seq_lens_q"].tolist(), 0, 0.0
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        seg = ids[a:e]
        if not bool((seg != ds.pad_id).any()):
            continue
        k = int((seg == IMG).sum()) // 4
        extra = {"pixel_values": pixels[r : r + k]} if k else {}
        with torch.no_grad():
            alone = ref(input_ids=seg[None], token_type_ids=(seg == IMG).long()[None], use_cache=False, **extra).logits[
                0
            ]
        worst = max(worst, float((alone - logits[a:e]).abs().max()))
        r += k
    assert r == pixels.shape[0] > 0 and worst < 1e-9


def test_llava_packed_store_equals_each_record_alone(tmp_path: Path) -> None:
    """LLaVA-1.5 (no image markers, 1 pixel row per image) through the store, the packer and the loader."""
    from vision_support import LLAVA_CONFIG, llava_docs, make_family_store

    torch.manual_seed(0)
    store = make_family_store(tmp_path / "s", llava_docs(10, seed=6), LLAVA_CONFIG)
    res = pack_store(PackConfig(store, 128, tmp_path / "p"))
    ds = PackedDataset(res.directory, size=128)
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
    assert set(batch) == {*HF_KEYS, "pixel_values"} and batch["pixel_values"].shape[1:] == (3, 16, 16)
    text = transformers.LlamaConfig(vocab_size=600, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=16, patch_size=4)  # fmt: skip
    config = transformers.LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_index=IMG,
                                      vision_feature_select_strategy="default", vision_feature_layer=-1)  # fmt: skip
    model = transformers.LlavaForConditionalGeneration(copy.deepcopy(config)).double().eval()
    model.set_attn_implementation("packtool")
    ref = transformers.LlavaForConditionalGeneration(copy.deepcopy(config)).double().eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs["pixel_values"] = inputs["pixel_values"].double()
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    ids, pixels = batch["input_ids"][0], inputs["pixel_values"]
    cu, r, worst = batch["cu_seq_lens_q"].tolist(), 0, 0.0
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        seg = ids[a:e]
        if not bool((seg != ds.pad_id).any()):
            continue
        k = int((seg == IMG).sum()) // 16
        extra = {"pixel_values": pixels[r : r + k]} if k else {}
        with torch.no_grad():
            alone = ref(input_ids=seg[None], **extra).logits[0]
        worst = max(worst, float((alone - logits[a:e]).abs().max()))
        r += k
    assert r == pixels.shape[0] > 0 and worst < 1e-9
