"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL adapters (packtool.vision) against transformers' own processors.

For each family a tiny model folder is built in tmp_path (a byte-level BPE with the family's special
tokens, Qwen2-VL's real chat template from tests/fixtures/chat_templates/qwen2_vl.json, the family's
preprocessor_config.json and config.json). Then, for conversations with images of many sizes and
modes (RGB, RGBA, LA, L, P with transparency, CMYK JPEG, 16-bit PNG, an EXIF-rotated JPEG, duplicates,
an image in the system turn, a text-only one), the reference is the real transformers processor
(`Qwen*VLProcessor` around `Qwen2VLImageProcessorPil`, chosen explicitly so the check is the same
whether torchvision is installed or not):
- ids: `processor.apply_chat_template(messages, tokenize=True)` == tokenizing `adapter.expand(text)`;
- pixel_values and image_grid_thw: equal, bit for bit (max abs difference 0.0);
- M-RoPE: `adapter.rope_positions` == `get_rope_index` of a tiny random-weight model of the family.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from support import zipf_texts
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from packtool.errors import ConfigError, FormatError, InputError
from packtool.vision import ImageInfo, VisionProcessor

FIXTURE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen2_vl.json"
FAMILIES = {
    "qwen2_vl": {
        "processor_class": "Qwen2VLProcessor",
        "preprocessor": {"min_pixels": 3136, "max_pixels": 40000, "patch_size": 14, "temporal_patch_size": 2,
                         "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                         "image_std": [0.26862954, 0.26130258, 0.27577711]},
    },
    "qwen2_5_vl": {
        "processor_class": "Qwen2_5_VLProcessor",
        "preprocessor": {"min_pixels": 3136, "max_pixels": 60000, "patch_size": 14, "temporal_patch_size": 2,
                         "merge_size": 2},
    },
    "qwen3_vl": {
        "processor_class": "Qwen3VLProcessor",
        "preprocessor": {"size": {"shortest_edge": 4096, "longest_edge": 50000}, "patch_size": 16,
                         "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                         "image_std": [0.5, 0.5, 0.5]},
    },
}


def build_qwen_folder(directory: Path, family: str) -> Path:
    spec = json.loads(FIXTURE.read_text("utf-8"))
    specials = [t["content"] for t in spec["added_tokens"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([*zipf_texts(200, seed=7), "Describe the picture.\n\nWhat is this?"] * 2, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": spec["chat_template"]}))
    info = FAMILIES[family]
    (directory / "preprocessor_config.json").write_text(json.dumps({
        **info["preprocessor"], "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": info["processor_class"]}))
    merge = info["preprocessor"]["merge_size"]
    (directory / "config.json").write_text(json.dumps({
        "model_type": family, "image_token_id": tok.token_to_id("<|image_pad|>"),
        "vision_config": {"spatial_merge_size": merge, "patch_size": info["preprocessor"]["patch_size"]}}))
    return directory


def vocab_of(directory: Path) -> dict[str, int]:
    return Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab(with_added_tokens=True)


def encode(image: Image.Image, fmt: str = "PNG", **kw: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def hostile_images(seed: int = 0) -> list[bytes]:
    """Images in every mode the processor meets, of many sizes."""
    rng = np.random.default_rng(seed)

    def noise(w: int, h: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")

    rotated = noise(90, 50).convert("RGB")
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    return [
        encode(noise(123, 77).convert("RGB")),
        encode(noise(300, 500)),  # RGBA
        encode(noise(40, 900).convert("L")),
        encode(noise(64, 48).convert("P"), transparency=3),  # palette with a transparent index
        encode(noise(33, 45).convert("CMYK"), "JPEG"),
        encode(Image.fromarray(rng.integers(0, 65535, (60, 100), dtype=np.uint16))),  # 16-bit grayscale
        encode(noise(57, 91).convert("LA")),
        encode(rotated, "JPEG", exif=exif.tobytes()),
        encode(noise(28, 28).convert("RGB")),
        encode(noise(1000, 12).convert("RGB")),  # very wide: resized up to min_pixels
        encode(noise(1, 1).convert("RGB")),  # one pixel
    ]


def conversations(n_images: int) -> list[tuple[list[dict[str, Any]], list[int]]]:
    """(messages with image parts by index, the image indices in order)."""
    img = [{"type": "image", "index": i} for i in range(n_images)]
    text = [{"type": "text", "text": t} for t in ("Describe the picture.", "What is this?", "And these two?")]
    return [
        ([{"role": "user", "content": [img[0], text[0]]}, {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], [0]),
        ([{"role": "system", "content": [text[1]]},
          {"role": "user", "content": [text[2], img[1], img[2], text[0], img[3]]},
          {"role": "assistant", "content": [{"type": "text", "text": "Three images."}]},
          {"role": "user", "content": [img[4], img[5]]},
          {"role": "assistant", "content": [{"type": "text", "text": "Two more."}]}], [1, 2, 3, 4, 5]),
        ([{"role": "system", "content": [img[6], text[1]]}, {"role": "user", "content": [img[7], img[7], img[8]]},
          {"role": "assistant", "content": [{"type": "text", "text": "Duplicates."}]}], [6, 7, 7, 8]),
        ([{"role": "user", "content": [img[9], text[0], img[10]]}], [9, 10]),
        ([{"role": "user", "content": [text[0]]}, {"role": "assistant", "content": [text[1]]}], []),
    ]


def with_paths(messages: list[dict[str, Any]], paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        content = [{"type": "image", "path": str(paths[p["index"]])} if p["type"] == "image" else p for p in m["content"]]
        out.append({"role": m["role"], "content": content})
    return out


# -- the transformers side ------------------------------------------------------------------------
def reference_processor(folder: Path, family: str) -> Any:
    """The family's real processor; its image processor read from the folder by transformers itself, the PIL
    backend named explicitly (the same check with or without torchvision)."""
    transformers = pytest.importorskip("transformers")

    cls = getattr(transformers, FAMILIES[family]["processor_class"])

    class NoVideo(cls):  # type: ignore[misc, valid-type]
        """Without torchvision there is no video processor; images never need one."""

        def check_argument_for_proper_class(self, name: str, arg: Any) -> Any:
            return None if arg is None else super().check_argument_for_proper_class(name, arg)

    image_processor = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    assert type(image_processor).__name__ == "Qwen2VLImageProcessorPil"
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(folder / "tokenizer.json")), eos_token="<|im_end|>")
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    # AutoProcessor would also build the video processor, which needs torchvision: the class is built directly
    return NoVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=template)


def tiny_model(family: str) -> Any:
    transformers = pytest.importorskip("transformers")
    text = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 800, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}
    if family == "qwen2_vl":
        vision = {"depth": 1, "embed_dim": 16, "num_heads": 2, "hidden_size": 16, "mlp_ratio": 1, "spatial_merge_size": 2}
        return transformers.Qwen2VLModel(transformers.Qwen2VLConfig(text_config=text, vision_config=vision))
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16,
              "spatial_merge_size": 2}
    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLModel(transformers.Qwen2_5_VLConfig(
            text_config=text, vision_config={**vision, "fullatt_block_indexes": [0]}))
    text = {k: v for k, v in text.items() if k != "rope_scaling"}  # Qwen3-VL's default rope is already M-RoPE
    return transformers.Qwen3VLModel(transformers.Qwen3VLConfig(
        text_config=text, vision_config={**vision, "patch_size": 16, "deepstack_visual_indexes": [0],
                                         "num_position_embeddings": 16}))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_ids_pixels_grids_and_rope_equal_transformers(tmp_path: Path, family: str) -> None:
    torch = pytest.importorskip("torch")
    folder = build_qwen_folder(tmp_path / "model", family)
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None and adapter.family == family and adapter.mrope and adapter.uses_grid
    assert adapter.token_types(np.arange(5)) is None
    blobs = hostile_images()
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(tmp_path / f"img{i}")
        paths[-1].write_bytes(blob)
    processor = reference_processor(folder, family)
    model = tiny_model(family)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for messages, order in conversations(len(blobs)):
        msgs = with_paths(messages, paths)
        ref = processor.apply_chat_template(msgs, tokenize=True, return_dict=True)
        text = processor.apply_chat_template(msgs, tokenize=False)
        infos = [adapter.measure(blobs[i], f"img{i}") for i in order]
        expanded, spans = adapter.expand(text, None, infos)
        assert spans is None
        ids = tok.encode(expanded, add_special_tokens=False).ids
        assert ids == list(ref["input_ids"][0]), (family, order)
        pixels, grids = adapter.pixel_rows([blobs[i] for i in order])
        if order:
            want = np.asarray(ref["pixel_values"])
            assert pixels.dtype == np.float32 and pixels.shape == want.shape
            assert float(np.abs(pixels - want).max()) == 0.0  # bit for bit
            assert grids is not None and grids.tolist() == np.asarray(ref["image_grid_thw"]).tolist()
            assert [i.grid for i in infos] == [tuple(g) for g in grids.tolist()]
            assert sum(i.n_patches for i in infos) == len(pixels)
        assert sum(i.n_tokens for i in infos) == ids.count(adapter.image_token_id)
        want_pos, _ = model.get_rope_index(
            torch.tensor([ids]), mm_token_type_ids=torch.tensor(ref["mm_token_type_ids"]),
            image_grid_thw=torch.tensor(grids) if order else None)
        got = adapter.rope_positions(np.asarray(ids, dtype=np.int64), grids)
        assert got is not None and got.dtype == np.int64
        assert got.tolist() == want_pos[:, 0].tolist(), (family, order)


def test_family_settings_read_from_the_folder(tmp_path: Path) -> None:
    q2 = VisionProcessor.from_dir(build_qwen_folder(tmp_path / "q2", "qwen2_vl"), vocab_of(tmp_path / "q2"))
    q3 = VisionProcessor.from_dir(build_qwen_folder(tmp_path / "q3", "qwen3_vl"), vocab_of(tmp_path / "q3"))
    assert q2 is not None and q3 is not None
    assert (q2.config["patch_size"], q2.config["max_pixels"], q2.config["image_mean"][0]) == (14, 40000, 0.48145466)
    assert (q3.config["patch_size"], q3.config["min_pixels"], q3.config["max_pixels"]) == (16, 4096, 50000)
    assert q3.config["image_mean"] == [0.5, 0.5, 0.5]
    # a 224x224 image: 16x16 patches of 14 px, 2x2 merged -> 64 tokens (Qwen2-VL, max_pixels 40000 keeps 196x196)
    info = q2.measure(encode(Image.new("RGB", (224, 224))))
    assert info == ImageInfo(n_tokens=49, grid=(1, 14, 14), n_patches=196)
    # top-level min/max pixels win over `size`, as in the processor's __init__
    raw = json.loads((tmp_path / "q3" / "preprocessor_config.json").read_text())
    (tmp_path / "q3" / "preprocessor_config.json").write_text(json.dumps({**raw, "max_pixels": 20000}))
    q3b = VisionProcessor.from_dir(tmp_path / "q3", vocab_of(tmp_path / "q3"))
    assert q3b is not None and q3b.config["max_pixels"] == 20000
    for size in (448, {"height": 448, "width": 448}):  # the processor's resize fails on these: refused, not defaulted
        (tmp_path / "q3" / "preprocessor_config.json").write_text(json.dumps({**raw, "size": size}))
        with pytest.raises(ConfigError, match="'size' must hold 'shortest_edge'"):
            VisionProcessor.from_dir(tmp_path / "q3", vocab_of(tmp_path / "q3"))


def test_picklable_and_rebuilt_from_its_config(tmp_path: Path) -> None:
    folder = build_qwen_folder(tmp_path / "m", "qwen2_5_vl")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    again = pickle.loads(pickle.dumps(adapter))
    rebuilt = VisionProcessor.from_config(json.loads(json.dumps(adapter.config)))
    blob = hostile_images()[0]
    assert again == adapter == rebuilt and rebuilt.family == "qwen2_5_vl"
    assert rebuilt.measure(blob) == adapter.measure(blob)
    assert np.array_equal(rebuilt.pixel_rows([blob])[0], adapter.pixel_rows([blob])[0])
    with pytest.raises(FormatError, match="unknown to this packtool"):
        VisionProcessor.from_config({**adapter.config, "family": "qwen9_vl"})
    with pytest.raises(FormatError, match="config is damaged.*patch_size"):
        VisionProcessor.from_config({k: v for k, v in adapter.config.items() if k != "patch_size"})
    with pytest.raises(FormatError, match="no family"):
        VisionProcessor.from_config({"patch_size": 14})


def test_expand_splits_target_spans_and_refuses_miscounts(tmp_path: Path) -> None:
    folder = build_qwen_folder(tmp_path / "m", "qwen2_vl")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    pad = "<|image_pad|>"
    text = f"ab{pad}cd{pad}ef"
    infos = [ImageInfo(3, (1, 2, 6), 12), ImageInfo(1, (1, 2, 2), 4)]
    out, spans = adapter.expand(text, [(0, len(text)), (2, 3)], infos)
    assert out == f"ab{pad * 3}cd{pad}ef"
    assert spans is not None and [out[a:b] for a, b in spans] == ["ab", "cd", "ef"]
    assert all(pad not in out[a:b] for a, b in spans)
    with pytest.raises(InputError, match="miscounted.*2 image placeholder.*1 image"):
        adapter.expand(text, None, infos[:1])
    with pytest.raises(InputError, match="miscounted"):
        adapter.expand("no image here", None, infos[:1])
    # a literal video token would make get_rope_index look for a video grid: refused by name
    with pytest.raises(InputError, match="literal special token '<\\|video_pad\\|>'"):
        adapter.expand(text + "<|video_pad|>", None, infos)
    # adjacent image runs cannot be told apart by get_rope_index: refused, not guessed
    ids = np.array([1] + [adapter.image_token_id] * 2, dtype=np.int64)
    with pytest.raises(InputError, match="run"):
        adapter.rope_positions(ids, np.array([[1, 2, 2], [1, 2, 2]]))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (valid CRC), with no pixel data behind it."""
    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])

    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def test_hostile_bytes_are_refused_by_name(tmp_path: Path) -> None:
    folder = build_qwen_folder(tmp_path / "m", "qwen2_vl")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    good = hostile_images()[0]
    cases = [
        (b"not an image at all", "not a readable image"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "not a readable image.*formats read: JPEG, PNG"),
        (good[: len(good) // 2], "cannot be decoded"),  # truncated
        (b"", "empty"),
        (png_header_only(30000, 30000), "refused.*pixel limit"),  # a decompression bomb, never decoded
        (encode(Image.new("RGB", (2010, 10))), "aspect ratio over 200"),
    ]
    for data, message in cases:
        with pytest.raises(InputError, match=message) as err:
            adapter.measure(data, "photos/cat.png")
        assert "photos/cat.png" in str(err.value)
        with pytest.raises(InputError, match=message):
            adapter.pixel_rows([good, data], ["a.png", "photos/cat.png"])


def test_from_dir_text_only_unsupported_and_mixed_folders(tmp_path: Path) -> None:
    text_only = tmp_path / "text"
    text_only.mkdir()
    (text_only / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert VisionProcessor.from_dir(text_only, {}) is None
    for name, files in [  # (LLaVA-1.5 is built: tests/test_vision_families_llava.py)
        ("LLaVA-NeXT", {"config.json": {"model_type": "llava_next"}, "preprocessor_config.json": {"image_processor_type": "CLIPImageProcessor"}}),
        ("LLaVA-NeXT", {"preprocessor_config.json": {"image_processor_type": "LlavaNextImageProcessor"}}),
        ("LLaVA-OneVision", {"processor_config.json": {"processor_class": "LlavaOnevisionProcessor"},
                             "preprocessor_config.json": {"image_processor_type": "LlavaOnevisionImageProcessorFast"}}),
        ("SmolVLM", {"preprocessor_config.json": {"processor_class": "SmolVLMProcessor"}}),
        ("Idefics3", {"config.json": {"model_type": "idefics3"}, "preprocessor_config.json": {}}),
    ]:
        folder = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        for file, content in files.items():
            (folder / file).write_text(json.dumps(content))
        with pytest.raises(ConfigError, match=rf"{name} is not supported yet.*gemma3.*qwen2_vl") as err:
            VisionProcessor.from_dir(folder, {})
        assert str(folder) in str(err.value)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "FancyNewImageProcessor"}))
    with pytest.raises(ConfigError, match="unknown vision-language model family.*FancyNew"):
        VisionProcessor.from_dir(odd, {})
    # a folder mixing two models: the merge sizes disagree
    mixed = build_qwen_folder(tmp_path / "mixed", "qwen2_vl")
    (mixed / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "vision_config": {"spatial_merge_size": 4}}))
    with pytest.raises(ConfigError, match="spatial_merge_size"):
        VisionProcessor.from_dir(mixed, vocab_of(mixed))
    (mixed / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "vision_config": {"patch_size": 16}}))
    with pytest.raises(ConfigError, match="vision_config.patch_size is 16"):
        VisionProcessor.from_dir(mixed, vocab_of(mixed))
    with pytest.raises(ConfigError, match="no image token '<\\|image_pad\\|>'"):
        VisionProcessor.from_dir(build_qwen_folder(tmp_path / "novocab", "qwen2_vl"), {"a": 1})
    (mixed / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read preprocessor_config.json"):
        VisionProcessor.from_dir(mixed, {})


def test_works_without_torch_torchvision_or_transformers(tmp_path: Path) -> None:
    """The adapter is numpy + PIL only: with torch, torchvision and transformers unimportable it reads the
    folder, measures and returns the same pixel rows (compared with this process's, which may have them)."""
    folder = build_qwen_folder(tmp_path / "m", "qwen3_vl")
    blob = hostile_images()[1]
    (tmp_path / "img.png").write_bytes(blob)
    script = f"""
import sys, json
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'torchvision', 'transformers', 'tokenizers'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import numpy as np
from packtool.vision import VisionProcessor
vocab = json.load(open({str(folder / 'tokenizer.json')!r}))['added_tokens']
adapter = VisionProcessor.from_dir(__import__('pathlib').Path({str(folder)!r}), {{t['content']: t['id'] for t in vocab}})
data = open({str(tmp_path / 'img.png')!r}, 'rb').read()
pixels, grids = adapter.pixel_rows([data])
np.save({str(tmp_path / 'pixels.npy')!r}, pixels)
print(json.dumps([adapter.measure(data).n_tokens, grids.tolist(), sorted(m for m in sys.modules if m.startswith(('torch', 'transformers')))]))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    n_tokens, grids, heavy = json.loads(out.stdout)
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None and heavy == []
    assert n_tokens == adapter.measure(blob).n_tokens and grids == adapter.pixel_rows([blob])[1].tolist()
    assert np.array_equal(np.load(tmp_path / "pixels.npy"), adapter.pixel_rows([blob])[0])


def test_registry_is_the_one_table_docs_and_detection_follow(tmp_path: Path) -> None:
    """Every family key and every refused family is in docs/VISION.md; every adapter has its comparison
    test module; every name an adapter claims is detected as that adapter and claimed by no other."""
    from packtool.vision.base import REGISTRY, UNSUPPORTED, _detect
    from packtool.vision.folder import ModelFolder

    docs = (Path(__file__).parents[1] / "docs" / "VISION.md").read_text("utf-8")
    assert all(f"`{key}`" in docs for key in REGISTRY)
    assert all(name in docs for name in UNSUPPORTED)
    adapters = set(REGISTRY.values())
    for adapter in adapters:
        module = "test_vision_families.py" if adapter.family == "qwen2_vl" else f"test_vision_families_{adapter.family}.py"
        assert (Path(__file__).parent / module).exists(), adapter
    claimed: dict[str, Any] = {}
    for adapter in adapters:
        for name in (*adapter.processor_classes, *adapter.model_types, *adapter.image_processor_types):
            assert claimed.setdefault(name, adapter) is adapter, name
            assert not any(name in table for row in UNSUPPORTED.values() for table in row), name
    for adapter in adapters:
        for name in adapter.processor_classes:
            folder = ModelFolder(path=tmp_path, image_processor={"processor_class": name}, image_processor_file=tmp_path)
            assert _detect(folder) is adapter
        for name in adapter.model_types:
            folder = ModelFolder(path=tmp_path, image_processor={}, image_processor_file=tmp_path, model={"model_type": name})
            assert _detect(folder) is adapter
