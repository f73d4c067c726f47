"""Vision-language records packed in one row equal each record alone under attn_implementation="packtool".

Tiny random-weight models of the real transformers classes, float64, CPU:
- Gemma 3: image tokens attend to their whole image (a bidirectional block inside a causal document). Packed
  with restarting position_ids, transformers 5.23 reads the sliding layers' image blocks at document-local
  indices, so the second document takes the first one's image layout (eager is 0.1+ off the documents alone,
  pinned below so the check can fail); "packtool" reads the blocks by their row-global ids and is exact.
- Qwen2-VL: M-RoPE positions `[4, 1, T]` (row 0 text positions restarting per document, rows 1-3 each
  document's own `get_rope_index`), pixel rows and grids concatenated in order: logits and gradients equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402,F401  (registers "packtool")

RTOL = 1e-6
IMAGE, BOI, EOI = 5, 6, 7


def close(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    scale = max(float(w.abs().max()) for w in want)
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / scale


def split(out: torch.Tensor, lens: list[int]) -> list[torch.Tensor]:
    bounds = np.cumsum([0, *lens])
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


# -- Gemma 3 ---------------------------------------------------------------------------------------
def gemma3() -> torch.nn.Module:
    small = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 128, "pad_token_id": 0,
             "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
    text = transformers.Gemma3TextConfig(**small, num_hidden_layers=2, sliding_window=6, query_pre_attn_scalar=8,
                                         layer_types=["sliding_attention", "full_attention"])
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=16, patch_size=4)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4, image_token_index=IMAGE, boi_token_index=BOI,
                                       eoi_token_index=EOI)
    torch.manual_seed(0)
    return transformers.Gemma3ForConditionalGeneration(config).to(torch.float64).eval()


def gemma3_docs() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Three documents: images at different offsets, two images in one, one text-only."""
    rng = np.random.default_rng(3)
    image = [BOI, IMAGE, IMAGE, IMAGE, IMAGE, EOI]

    def text(n: int) -> list[int]:
        return rng.integers(8, 96, n).tolist()

    docs = [text(9) + image + text(5), text(3) + image + text(2) + image + text(4), text(7), image + text(6)]
    images = [torch.randn(1, 3, 16, 16, dtype=torch.float64), torch.randn(2, 3, 16, 16, dtype=torch.float64),
              torch.zeros(0, 3, 16, 16, dtype=torch.float64), torch.randn(1, 3, 16, 16, dtype=torch.float64)]
    return [torch.tensor(d) for d in docs], images


def run_gemma3(model: torch.nn.Module, ids: torch.Tensor, pixels: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
    extra = {"pixel_values": pixels} if len(pixels) else {}
    return model(input_ids=ids[None], token_type_ids=(ids == IMAGE).long()[None], use_cache=False, **extra,
                 **kw).logits[0]


def test_gemma3_packed_images_equal_each_record_alone() -> None:
    model = gemma3()
    docs, images = gemma3_docs()
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = [run_gemma3(model, d, p) for d, p in zip(docs, images, strict=True)]
    ids = torch.cat(docs)
    pixels = torch.cat(images)
    lens = [len(d) for d in docs]
    positions = torch.cat([torch.arange(n) for n in lens])[None]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = split(run_gemma3(model, ids, pixels, position_ids=positions), lens)
    assert close(eager, want) > 1e-3  # transformers' own packed mask is wrong here: the check below can fail
    model.set_attn_implementation("packtool")
    with torch.no_grad():
        assert close([run_gemma3(model, d, p) for d, p in zip(docs, images, strict=True)], want) < RTOL
        got = split(run_gemma3(model, ids, pixels, position_ids=positions), lens)
    assert close(got, want) < RTOL
    cu = torch.tensor(np.cumsum([0, *lens]), dtype=torch.int32)
    with torch.no_grad():
        got = split(run_gemma3(model, ids, pixels, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                               max_length_q=max(lens), max_length_k=max(lens)), lens)  # fmt: skip
    assert close(got, want) < RTOL


# -- Qwen2-VL --------------------------------------------------------------------------------------
PAD, START, END = 90, 91, 92  # image pad, vision start, vision end (inside the tiny vocabulary)


def qwen2_vl() -> torch.nn.Module:
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 96, "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}
    vision = {"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 16, "mlp_ratio": 1, "spatial_merge_size": 2}
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=PAD,
                                        vision_start_token_id=START, vision_end_token_id=END)
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).to(torch.float64)


def qwen_docs() -> list[dict[str, torch.Tensor]]:
    """Documents with images of different grids (t, h, w in patches; tokens = h*w/4)."""
    rng = np.random.default_rng(5)
    row = 3 * 2 * 14 * 14

    def doc(parts: list[object]) -> dict[str, torch.Tensor]:
        ids: list[int] = []
        grids = []
        for part in parts:
            if isinstance(part, tuple):
                grids.append(part)
                ids += [START] + [PAD] * (part[1] * part[2] // 4) + [END]
            else:
                ids += rng.integers(1, 89, int(part)).tolist()  # type: ignore[call-overload]
        out = {"input_ids": torch.tensor([ids]), "mm_token_type_ids": (torch.tensor([ids]) == PAD).int()}
        if grids:
            grid = torch.tensor(grids)
            out["image_grid_thw"] = grid
            out["pixel_values"] = torch.randn(int(grid.prod(-1).sum()), row, dtype=torch.float64)
        return out

    return [doc([4, (1, 4, 6), 5]), doc([3, (1, 2, 2), 2, (1, 6, 4), 3]), doc([8]), doc([(1, 4, 4), 6])]


def test_qwen2_vl_packed_mrope_positions_equal_each_record_alone() -> None:
    model = qwen2_vl()
    docs = qwen_docs()
    model.set_attn_implementation("sdpa")
    weights = [torch.randn(d["input_ids"].shape[1], 96, dtype=torch.float64) for d in docs]
    want, want_grads = [], []
    for d, w in zip(docs, weights, strict=True):
        model.zero_grad()
        out = model(**d).logits[0]
        (out * w).sum().backward()
        want.append(out.detach())
        want_grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()])
    total = [sum(g) for g in zip(*want_grads, strict=True)]
    rows = []
    for d in docs:
        rope, _ = model.model.get_rope_index(d["input_ids"], mm_token_type_ids=d["mm_token_type_ids"],
                                             image_grid_thw=d.get("image_grid_thw"))
        n = d["input_ids"].shape[1]
        rows.append(torch.cat([torch.arange(n).view(1, 1, n), rope], 0))
    lens = [d["input_ids"].shape[1] for d in docs]
    batch = {
        "input_ids": torch.cat([d["input_ids"] for d in docs], -1),
        "position_ids": torch.cat(rows, -1),  # [4, 1, T]
        "pixel_values": torch.cat([d["pixel_values"] for d in docs if "pixel_values" in d]),
        "image_grid_thw": torch.cat([d["image_grid_thw"] for d in docs if "image_grid_thw" in d]),
    }
    assert batch["position_ids"].shape == (4, 1, sum(lens))
    model.set_attn_implementation("packtool")
    model.zero_grad()
    out = model(**batch).logits[0]
    (out * torch.cat(weights)).sum().backward()
    assert close(split(out.detach(), lens), want) < RTOL
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    assert close(grads, total) < RTOL
    # the check can fail: positions of one sequence over the whole row mix the documents' rotations
    with torch.no_grad():
        wrong = model(**{**batch, "position_ids": None, "mm_token_type_ids": (batch["input_ids"] == PAD).int()}).logits[0]
    assert close(split(wrong, lens), want) > 1e-3
