"""Vision test support: token stores with images written through the format module, with the real Qwen2-VL
family adapter (`packtool.vision`) rebuilt from a config (`PROCESSOR_CONFIG`: 14-pixel patches, 2x2 merge,
M-RoPE; min_pixels 28*28 so that every size below is kept as it is).

Images are real PNGs (PIL) of sizes that are multiples of 28, so a grid is (1, h/14, w/14), its patches
h*w/196 and its tokens patches/4. Documents are `[text] [VSTART IMG*n VEND] [text] ...`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packtool.formats.token_store import TokenStoreWriter

VOCAB = 600
IMG = 597  # the image token
VSTART = 598
VEND = 599
PAD = 1
EOS = 0
TOKENIZER = {
    "name": "org/tiny-vl",
    "sha256": "0" * 64,
    "vocab_size": VOCAB,
    "bos_id": None,
    "eos_id": EOS,
    "pad_id": PAD,
}
FAMILY = "qwen2_vl"
PROCESSOR_CONFIG: dict[str, Any] = {
    "family": FAMILY,
    "placeholder": "<|image_pad|>",
    "image_token": "<|image_pad|>",
    "image_token_id": IMG,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "spatial_merge_size": 2,
    "min_pixels": 28 * 28,
    "max_pixels": 28 * 28 * 1280,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
}


def png(h: int, w: int, seed: int, fmt: str = "PNG") -> bytes:
    """A random image (noise over a gradient) encoded as `fmt`."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, w, dtype=np.float32)[None, :, None]
    arr = np.clip(ramp + rng.integers(0, 56, size=(h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt)
    return buf.getvalue()


def info(data: bytes) -> tuple[int, tuple[int, int, int], int]:
    """(n_tokens, grid, n_patches) of an image under the fake processor."""
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
    grid = (1, h // 14, w // 14)
    patches = grid[0] * grid[1] * grid[2]
    return patches // 4, grid, patches


@dataclass
class Doc:
    ids: np.ndarray
    images: list[tuple[int, bytes]]  # (token offset of the first image token, bytes)


def random_docs(
    n: int, seed: int = 0, max_text: int = 60, p_image: float = 0.6, pool: int = 5, side: int = 28, fmt: str = "PNG"
) -> list[Doc]:
    """Documents of random text with 0..3 images each, drawn from a pool of `pool` images (duplicates);
    images are (side * 1..3) x (side * 1..3) pixels (`side` a multiple of 28)."""
    rng = np.random.default_rng(seed)
    sizes = [(side * (1 + i % 3), side * (1 + (i // 3) % 3)) for i in range(pool)]
    images = [png(h, w, seed * 100 + i, fmt) for i, (h, w) in enumerate(sizes)]
    docs = []
    for _ in range(n):
        parts: list[np.ndarray] = [rng.integers(2, 590, size=int(rng.integers(1, max_text)))]
        at: list[tuple[int, bytes]] = []
        k = int(rng.integers(1, 4)) if rng.random() < p_image else 0
        for _ in range(k):
            data = images[int(rng.integers(0, pool))]
            ntok = info(data)[0]
            offset = sum(p.size for p in parts) + 1
            parts += [np.array([VSTART]), np.full(ntok, IMG), np.array([VEND])]
            parts.append(rng.integers(2, 590, size=int(rng.integers(0, max_text))))
            at.append((offset, data))
        docs.append(Doc(np.concatenate(parts).astype(np.int64), at))
    return docs


def vision_key() -> dict[str, Any]:
    return {"family": FAMILY, "processor": dict(PROCESSOR_CONFIG), "image_token_id": IMG}


def write_docs(writer: TokenStoreWriter, docs: list[Doc]) -> None:
    """Append documents and their images (global document indices)."""
    assert writer.media is not None
    for doc in docs:
        d = writer.n_documents
        writer.append(doc.ids, np.array([doc.ids.size]))
        for offset, data in doc.images:
            ntok, grid, patches = info(data)
            writer.media.add(d, offset, ntok, grid, patches, data)


def make_vision_store(path: Path, docs: list[Doc], extra: dict[str, Any] | None = None) -> Path:
    """A vision token store written with the format module."""
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, np.dtype("<u2"), with_media=True)
    write_docs(writer, docs)
    writer.finish({"packtool_version": "test", "tokenizer": dict(TOKENIZER), "vision": vision_key(), **(extra or {})})
    return path


# -- Gemma 3: fixed counts (GEMMA_TOKENS soft tokens an image), pixels resized to 16x16, token types ------------
BOI, EOI = 595, 594  # <start_of_image>, <end_of_image>; the soft image token is IMG
GEMMA_TOKENS = 4
GEMMA_CONFIG: dict[str, Any] = {
    "family": "gemma3",
    "placeholder": "<start_of_image>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
    "image_token_id": IMG,
    "image_seq_length": GEMMA_TOKENS,
    "height": 16,
    "width": 16,
    "vision_patch_size": 4,
    "resample": 2,
    "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
}


def gemma_docs(n: int, seed: int = 0, max_text: int = 30) -> list[Doc]:
    """Documents `[text] (BOI IMG*4 EOI [text])*k` with k in 0..3 images of a pool of 4."""
    rng = np.random.default_rng(seed)
    images = [png(20 + 8 * i, 24, seed * 10 + i) for i in range(4)]
    docs = []
    for _ in range(n):
        parts: list[np.ndarray] = [rng.integers(8, 590, size=int(rng.integers(1, max_text)))]
        at: list[tuple[int, bytes]] = []
        for _ in range(int(rng.integers(0, 4))):
            at.append((sum(p.size for p in parts) + 1, images[int(rng.integers(0, 4))]))
            parts += [np.array([BOI]), np.full(GEMMA_TOKENS, IMG), np.array([EOI]), rng.integers(8, 590, 3)]
        docs.append(Doc(np.concatenate(parts).astype(np.int64), at))
    return docs


def make_gemma_store(path: Path, docs: list[Doc]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, np.dtype("<u2"), with_media=True)
    assert writer.media is not None
    for doc in docs:
        d = writer.n_documents
        writer.append(doc.ids, np.array([doc.ids.size]))
        for offset, data in doc.images:
            writer.media.add(d, offset, GEMMA_TOKENS, (1, 4, 4), 16, data)
    vision = {"family": "gemma3", "processor": dict(GEMMA_CONFIG), "image_token_id": IMG}
    writer.finish({"packtool_version": "test", "tokenizer": dict(TOKENIZER), "vision": vision})
    return path


# -- LLaVA-1.5: fixed counts (16 tokens: a 16x16 crop in 4-pixel patches, CLS dropped), no markers ------------------
LLAVA_CONFIG: dict[str, Any] = {
    "family": "llava",
    "placeholder": "<image>",
    "image_token": "<image>",
    "image_token_id": IMG,
    "shortest_edge": 16,
    "height": None,
    "width": None,
    "crop_height": 16,
    "crop_width": 16,
    "patch_size": 4,
    "num_additional_image_tokens": 1,
    "vision_feature_select_strategy": "default",
    "resample": 3,
    "rescale_factor": 1 / 255,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
}


def llava_docs(n: int, seed: int = 0, max_text: int = 30) -> list[Doc]:
    """Documents `[text] (IMG*16 [text])*k`, k in 0..2, of a pool of 3 images."""
    rng = np.random.default_rng(seed)
    images = [png(20 + 8 * i, 28, seed * 10 + i) for i in range(3)]
    docs = []
    for _ in range(n):
        parts: list[np.ndarray] = [rng.integers(8, 590, size=int(rng.integers(1, max_text)))]
        at: list[tuple[int, bytes]] = []
        for _ in range(int(rng.integers(0, 3))):
            at.append((sum(p.size for p in parts), images[int(rng.integers(0, 3))]))
            parts += [np.full(16, IMG), rng.integers(8, 590, 3)]
        docs.append(Doc(np.concatenate(parts).astype(np.int64), at))
    return docs


def make_family_store(path: Path, docs: list[Doc], config: dict[str, Any]) -> Path:
    """A store of `docs` whose images are measured by the family adapter rebuilt from `config`."""
    from packtool.vision import VisionProcessor

    proc = VisionProcessor.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, np.dtype("<u2"), with_media=True)
    assert writer.media is not None
    for doc in docs:
        d = writer.n_documents
        writer.append(doc.ids, np.array([doc.ids.size]))
        for offset, data in doc.images:
            m = proc.measure(data)
            writer.media.add(d, offset, m.n_tokens, m.grid, m.n_patches, data)
    vision = {"family": config["family"], "processor": dict(config), "image_token_id": IMG}
    writer.finish({"packtool_version": "test", "tokenizer": dict(TOKENIZER), "vision": vision})
    return path
