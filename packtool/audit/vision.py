"""The audit of a vision-language model: documents WITH images, packed vs each alone (Qwen2/2.5/3-VL, Gemma 3).

The config is shrunk like a text model's (`tiny.py` on its text config, M-RoPE sections rescaled to the
tiny head), with a one-block vision tower of the family's own classes; its patch size, temporal patch and
merge (which fix the pixel rows and the image token counts) are kept. The documents are text with images
of several grids (two images in one document, one text-only document, an image at a document's start).

Each document alone is the model called as a processor's output is passed: ids, `pixel_values`,
`image_grid_thw` and `mm_token_type_ids` (Qwen), `token_type_ids` (Gemma 3); the model computes its own
positions. The packed batch is what `PackedDataset` + `PackedCollator(flatten=True, keys=...)` give for
those documents: pixel rows and grids concatenated in order, `position_ids [4, 1, T]` for M-RoPE (row 0
text positions restarting per document, rows 1-3 each document's own `get_rope_index`), `token_type_ids`
for Gemma 3. Gemma 3 is the case that separates implementations: packed with restarting positions,
transformers' eager and sdpa masks read the sliding layers' bidirectional image blocks at document-local
indices (a later document takes an earlier one's image layout), so they leak; "packtool" is exact.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packtool.audit import probe
from packtool.audit.source import VISION_FAMILIES as FAMILIES
from packtool.audit.tiny import HIDDEN, VOCAB, check_size, tiny_config_dict
from packtool.errors import InputError
from packtool.loader.collator import PackedCollator

#: batch styles of a vision batch (flattened rows: `[B, N]` rows and seq_idx have nothing to add here)
STYLES = ("flat_position_ids", "flat_cu_seq_lens")
#: special ids inside the tiny vocabulary (text tokens are drawn below them)
IMAGE, START, END, VIDEO = VOCAB - 8, VOCAB - 7, VOCAB - 6, VOCAB - 5
TEXT_MAX = VOCAB - 10
#: Gemma 3's tiny tower: 16-pixel images of 4-pixel patches pooled to 2x2 = 4 tokens per image
GEMMA_IMAGE, GEMMA_PATCH, GEMMA_TOKENS = 16, 4, 4


@dataclass
class Doc:
    ids: torch.Tensor  # [n] int64
    pixels: torch.Tensor  # rows (Qwen) or images (Gemma 3); first dimension 0 for a text-only document
    grids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 3, dtype=torch.int64))


def tiny_vision_config(config: Any) -> tuple[Any, dict[str, Any], list[int]]:
    """The shrunk full config (text via `tiny_config_dict`, a one-block tower), its text dict, the kept layers."""
    d = config.to_dict()
    kind = FAMILIES[d["model_type"]]
    text_cls = type(config.get_text_config(decoder=True))
    text, kept = tiny_config_dict(d["text_config"], dict(getattr(text_cls, "attribute_map", {})))
    vision = d["vision_config"]
    if kind == "qwen":
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(text.get(key), dict):  # sections of head_dim / 2 = 8 (t, h, w)
                text[key] = {**text[key], "mrope_section": [4, 2, 2]}
        keep = {k: vision[k] for k in ("patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels",
                                       "in_chans", "window_size", "model_type") if k in vision}  # fmt: skip
        small: dict[str, Any] = {"depth": 2, "num_heads": 2, "hidden_act": vision.get("hidden_act", "gelu")}
        if d["model_type"] == "qwen2_vl":
            small.update(embed_dim=32, hidden_size=HIDDEN, mlp_ratio=1)
        else:
            small.update(hidden_size=32, intermediate_size=32, out_hidden_size=HIDDEN)
        if d["model_type"] == "qwen2_5_vl":
            small["fullatt_block_indexes"] = [1]  # one windowed block, one full block
        if d["model_type"].startswith("qwen3_vl"):
            small.update(deepstack_visual_indexes=[0], num_position_embeddings=16)
        d["vision_config"] = {**keep, **small}
        d.update(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)
    else:
        d["vision_config"] = {"model_type": vision.get("model_type", "siglip_vision_model"), "hidden_size": 32,
                              "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
                              "image_size": GEMMA_IMAGE, "patch_size": GEMMA_PATCH}  # fmt: skip
        d.update(mm_tokens_per_image=GEMMA_TOKENS, image_token_index=IMAGE, boi_token_index=START,
                 eoi_token_index=END)  # fmt: skip
    d["text_config"] = text
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(d.get(key), int):
            d[key] = int(d[key]) % VOCAB
    d["tie_word_embeddings"] = bool(d.get("tie_word_embeddings", False))
    return type(config).from_dict(d), text, kept


def documents(config: Any, seed: int) -> list[Doc]:
    """Four documents: images of different grids at different offsets, two in one, one text-only."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)

    def text(n: int) -> list[int]:
        return rng.integers(1, TEXT_MAX, n).tolist()

    if FAMILIES[config.model_type] == "gemma3":
        block = [START] + [IMAGE] * GEMMA_TOKENS + [END]
        out = []
        gemma: list[list[Any]] = [[9, "image", 5], [3, "image", 2, "image", 4], [7], ["image", 6]]
        for spec in gemma:
            tokens = [t for part in spec for t in (block if part == "image" else text(int(part)))]
            k = spec.count("image")
            pixels = torch.randn(k, 3, GEMMA_IMAGE, GEMMA_IMAGE, generator=gen, dtype=torch.float64)
            out.append(Doc(torch.tensor(tokens), pixels))
        return out
    v = config.vision_config
    merge = int(v.spatial_merge_size)
    row = (
        int(getattr(v, "in_channels", getattr(v, "in_chans", 3))) * int(v.temporal_patch_size) * int(v.patch_size) ** 2
    )
    layout: list[list[Any]] = [[5, (2, 3), 4], [3, (1, 1), 2, (2, 2), 3], [8], [(1, 2), 5]]  # grids in merged units
    docs = []
    for parts in layout:
        ids: list[int] = []
        grids = []
        for part in parts:
            if isinstance(part, tuple):
                h, w = part[0] * merge, part[1] * merge
                grids.append((1, h, w))
                ids += [START] + [IMAGE] * (part[0] * part[1]) + [END]
            else:
                ids += text(int(part))
        grid = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
        pixels = torch.randn(int(grid.prod(-1).sum()), row, generator=gen, dtype=torch.float64)
        docs.append(Doc(torch.tensor(ids), pixels, grid))
    return docs


def alone_inputs(kind: str, doc: Doc) -> dict[str, Any]:
    """One document as a processor's output is passed to the model (its positions computed by the model)."""
    ids = doc.ids[None]
    out: dict[str, Any] = {"input_ids": ids}
    if kind == "gemma3":
        out["token_type_ids"] = (ids == IMAGE).long()
        if len(doc.pixels):
            out["pixel_values"] = doc.pixels
        return out
    out["mm_token_type_ids"] = (ids == IMAGE).int()
    if len(doc.grids):
        out.update(pixel_values=doc.pixels, image_grid_thw=doc.grids)
    return out


def packed_batch(kind: str, model: Any, docs: list[Doc], style: str) -> dict[str, Any]:
    """The batch `PackedCollator(flatten=True, keys=...)` gives for these documents as `PackedDataset` items."""
    items = []
    for doc in docs:
        n = int(doc.ids.numel())
        item: dict[str, Any] = {"input_ids": doc.ids, "labels": doc.ids.clone(), "position_ids": torch.arange(n),
                                "cu_seqlens": torch.tensor([0, n], dtype=torch.int32), "pixel_values": doc.pixels}  # fmt: skip
        if kind == "gemma3":
            item["token_type_ids"] = (doc.ids == IMAGE).long()
        else:
            item["image_grid_thw"] = doc.grids
            with torch.no_grad():
                rope, _ = model.model.get_rope_index(
                    doc.ids[None], mm_token_type_ids=(doc.ids == IMAGE).int()[None],
                    image_grid_thw=doc.grids if len(doc.grids) else None,
                )  # fmt: skip
            item["position_ids"] = torch.cat([torch.arange(n)[None], rope[:, 0]], 0)  # [4, n], as the loader
        items.append(item)
    return PackedCollator(flatten=True, keys=probe.STYLES[style][1])(items)


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1].to(torch.float64), ids[1:], reduction="sum")


def _grads(model: Any, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


def reference(kind: str, model: Any, docs: list[Doc], backward: bool) -> probe.Outputs:
    with torch.set_grad_enabled(backward):
        logits = [model(**alone_inputs(kind, d), use_cache=False).logits[0] for d in docs]
    if not backward:
        return torch.cat(logits).detach(), None
    loss = sum((_loss(lg, d.ids) for lg, d in zip(logits, docs, strict=True)), torch.zeros((), dtype=torch.float64))
    return torch.cat(logits).detach(), _grads(model, loss)


def packed(model: Any, docs: list[Doc], batch: dict[str, Any], backward: bool) -> probe.Outputs:
    with torch.set_grad_enabled(backward):
        logits = model(**batch, use_cache=False).logits[0]
    if not backward:
        return logits.detach(), None
    bounds = np.cumsum([0, *(int(d.ids.numel()) for d in docs)])
    loss = sum((_loss(logits[a:b], d.ids) for a, b, d in zip(bounds[:-1], bounds[1:], docs, strict=True)),
               torch.zeros((), dtype=torch.float64))  # fmt: skip
    return logits.detach(), _grads(model, loss)


def build(transformers: Any, tiny: Any, impl: str, dtype: torch.dtype, seed: int) -> Any:
    torch.manual_seed(seed)
    return transformers.AutoModelForImageTextToText.from_config(
        copy.deepcopy(tiny), attn_implementation=impl, dtype=dtype, experts_implementation="eager"
    ).eval()  # eager experts: grouped_mm kernels have no float64


def measure(
    transformers: Any, config: Any, impls: tuple[str, ...], seed: int, flex: Any = contextlib.nullcontext
) -> dict[str, Any]:
    """Every vision style under every implementation: results, the tiny config and what the documents hold.
    `flex`: the context the flex_attention runs go under (audit.py's reference-math switch)."""
    try:
        tiny, text, kept = tiny_vision_config(config)
    except Exception as exc:  # noqa: BLE001 - the config class validating the shrunk dict
        raise InputError(f"cannot shrink the vision-language config to a tiny model ({probe.first_line(exc)})",
                         hint="the audit supports the family's usual config layout") from None  # fmt: skip
    with torch.device("meta"):
        check_size(transformers.AutoModelForImageTextToText.from_config(copy.deepcopy(tiny)))
    kind = FAMILIES[config.model_type]
    docs = documents(tiny, seed)
    results: list[probe.Measurement] = []
    architecture = ""
    with flex() if "flex_attention" in impls else contextlib.nullcontext():
        for impl in impls:
            architecture = _run(transformers, tiny, kind, impl, docs, seed, results) or architecture
    n_images = sum(int(d.pixels.shape[0]) if kind == "gemma3" else int(d.grids.shape[0]) for d in docs)
    image_tokens = sum(int((d.ids == IMAGE).sum()) for d in docs)
    return {
        "results": results,
        "architecture": architecture,
        "text": text,
        "kept": kept,
        "lengths": [int(d.ids.numel()) for d in docs],
        "images": f"{n_images} images ({image_tokens} image tokens) in {sum(1 for d in docs if len(d.pixels))} "
        f"of {len(docs)} documents",
    }


def _run(
    transformers: Any, tiny: Any, kind: str, impl: str, docs: list[Doc], seed: int, results: list[probe.Measurement]
) -> str | None:
    """Both styles under one implementation (float64 where it runs, else float32), appended to `results`."""
    dtype = probe.IMPLEMENTATIONS[impl]
    backward = impl not in probe.FORWARD_ONLY
    missing = probe.unavailable_reason(impl)
    model = ref = None
    candidates = [] if missing is not None else [dtype, torch.float32] if dtype == torch.float64 else [dtype]
    for candidate in candidates:
        try:
            model = build(transformers, tiny, impl, candidate, seed)
            ref = reference(kind, model, docs, backward)
            dtype, missing = candidate, None
            break
        except Exception as exc:  # noqa: BLE001 - any failure of a kernel is a verdict
            model, missing = None, probe.first_line(exc)
    name = str(dtype).removeprefix("torch.")
    for style in STYLES:
        if model is None or ref is None:
            results.append(probe.Measurement(style, impl, name, None, None, None, None, "unsupported", missing))
            continue
        try:
            got = packed(model, docs, packed_batch(kind, model, docs, style), backward)
        except Exception as exc:  # noqa: BLE001
            reason = probe.first_line(exc)
            results.append(probe.Measurement(style, impl, name, None, None, None, None, "unsupported", reason))
            continue
        dl, dg, tl, tg, verdict, why = probe.compare(ref, got, dtype)
        results.append(probe.Measurement(style, impl, name, dl, dg, tl, tg, verdict, why))
    return type(model).__name__ if model is not None else None


def batch_keys(config: Any) -> list[str]:
    """The image keys a packed batch of this family passes beside the text keys."""
    if FAMILIES[config.model_type] == "gemma3":
        return ["pixel_values", "token_type_ids"]
    return ["pixel_values", "image_grid_thw"]


def advice(recommended: dict[str, Any] | None, results: list[probe.Measurement], extra: list[str]) -> str:
    leaking = sorted({r.attn_implementation for r in results if r.verdict == "leaks"})
    leak = (
        f"; {', '.join(leaking)} leak{'s' if len(leaking) == 1 else ''} (do not train packed images with {'it' if len(leaking) == 1 else 'them'})"
        if leaking
        else ""
    )
    if recommended is None:
        return (
            "packing with images is not exact under any attention implementation present" + leak + ": train the "
            "images padded (PaddedCollator), or re-run with attn_implementation='packtool' available (import packtool.hf)"
        )
    style, impl = recommended["style"], recommended["attn_implementation"]
    keys = probe.STYLES[style][1]
    return (
        f"packing with images is exact with {style} under attn_implementation={impl!r}: build batches with "
        f"PackedCollator(flatten=True, keys={keys}) ({', '.join(extra)} travel with them"
        f"{', position_ids as [4, 1, T] M-RoPE rows' if 'image_grid_thw' in extra else ''}){leak}"
    )
