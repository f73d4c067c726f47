"""LLaVA-1.5 adapter (packtool.vision.llava) against `AutoProcessor.from_pretrained(folder, backend="pil")`
(`LlavaProcessor` around `CLIPImageProcessorPil`) on a tiny folder with llava-1.5-7b-hf's real chat
template: ids and pixel_values (bit for bit) equal for images of many sizes and modes; the other LLaVA
families stay refused by name.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from packtool.errors import ConfigError
from packtool.vision import ImageInfo, VisionProcessor

#: llava-hf/llava-1.5-7b-hf chat_template.json, as quoted verbatim in public repositories
TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]


def build_llava_folder(directory: Path, **preprocessor: Any) -> Path:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["USER: What is shown here? ASSISTANT: A cat on a mat. \n"] * 40, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "crop_size": {"height": 56, "width": 56}, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True,
        "do_rescale": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
        "processor_class": "LlavaProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 56}, **preprocessor}))
    (directory / "processor_config.json").write_text(json.dumps({
        "image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
        "processor_class": "LlavaProcessor", "vision_feature_select_strategy": "default"}))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llava", "image_token_index": tok.token_to_id("<image>")}))
    return directory


def vocab_of(directory: Path) -> dict[str, int]:
    return Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab(with_added_tokens=True)


def images(seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for mode, (w, h), fmt in [("RGB", (123, 77), "PNG"), ("RGBA", (40, 300), "PNG"), ("L", (56, 56), "PNG"),
                              ("P", (90, 51), "PNG"), ("CMYK", (33, 45), "JPEG"), ("LA", (1, 1), "PNG"),
                              ("RGB", (57, 400), "JPEG")]:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA").convert(mode)
        buf = io.BytesIO()
        img.save(buf, fmt)
        out.append(buf.getvalue())
    return out


def test_ids_and_pixels_equal_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = build_llava_folder(tmp_path / "model")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None and adapter.family == "llava"
    assert not (adapter.mrope or adapter.uses_grid or adapter.token_type_ids)
    processor = transformers.AutoProcessor.from_pretrained(str(folder), backend="pil")
    assert type(processor.image_processor).__name__ == "CLIPImageProcessorPil"
    blobs = images()
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(tmp_path / f"img{i}")
        paths[-1].write_bytes(blob)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def img(i: int) -> dict[str, Any]:
        return {"type": "image", "path": str(paths[i])}

    conversations = [
        ([{"role": "user", "content": [img(0), {"type": "text", "text": "What is shown here?"}]},
          {"role": "assistant", "content": [{"type": "text", "text": "A cat on a mat."}]}], [0]),
        ([{"role": "user", "content": [img(1), img(2), img(3), img(4), img(5), img(6), img(6)]}], [1, 2, 3, 4, 5, 6, 6]),
    ]
    for messages, order in conversations:
        ref = processor.apply_chat_template(messages, tokenize=True, return_dict=True)
        text = processor.apply_chat_template(messages, tokenize=False)
        infos = [adapter.measure(blobs[i]) for i in order]
        assert all(i == ImageInfo(n_tokens=16, grid=(1, 4, 4), n_patches=16) for i in infos)  # (56/14)^2 + 1 - 1
        expanded, _ = adapter.expand(text, None, infos)
        assert tok.encode(expanded).ids == list(ref["input_ids"][0])
        pixels, grids = adapter.pixel_rows([blobs[i] for i in order])
        want = np.asarray(ref["pixel_values"])
        assert grids is None and pixels.shape == want.shape == (len(order), 3, 56, 56)
        assert float(np.abs(pixels - want).max()) == 0.0


def test_fixed_size_full_strategy_and_refusals(tmp_path: Path) -> None:
    folder = build_llava_folder(tmp_path / "fixed", size={"height": 70, "width": 84}, do_center_crop=False)
    raw = json.loads((folder / "processor_config.json").read_text())
    (folder / "processor_config.json").write_text(json.dumps({**raw, "vision_feature_select_strategy": "full"}))
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    blob = images()[0]
    assert adapter.measure(blob) == ImageInfo(n_tokens=5 * 6 + 1, grid=(1, 5, 6), n_patches=30)
    assert adapter.pixel_rows([blob])[0].shape == (1, 3, 70, 84)
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    from transformers.image_utils import load_image

    (tmp_path / "x.png").write_bytes(blob)
    assert np.array_equal(adapter.pixel_rows([blob])[0], np.asarray(ref([load_image(str(tmp_path / "x.png"))])["pixel_values"]))

    square = build_llava_folder(tmp_path / "square", crop_size=56, size=56)  # integers: a square crop, a short side
    assert VisionProcessor.from_dir(square, vocab_of(square)) == VisionProcessor.from_dir(
        build_llava_folder(tmp_path / "dicts"), vocab_of(tmp_path / "dicts"))
    small = build_llava_folder(tmp_path / "small", size={"shortest_edge": 28})
    with pytest.raises(ConfigError, match="smaller than crop_size"):
        VisionProcessor.from_dir(small, vocab_of(small))
    nopatch = build_llava_folder(tmp_path / "nopatch")
    (nopatch / "processor_config.json").write_text(json.dumps({"processor_class": "LlavaProcessor"}))
    with pytest.raises(ConfigError, match="no patch_size"):
        VisionProcessor.from_dir(nopatch, vocab_of(nopatch))
    for name, cls in [("LLaVA-NeXT", "LlavaNextProcessor"), ("LLaVA-OneVision", "LlavaOnevisionProcessor")]:
        other = build_llava_folder(tmp_path / name)
        (other / "processor_config.json").write_text(json.dumps({"processor_class": cls, "patch_size": 14}))
        with pytest.raises(ConfigError, match=f"{name} is not supported yet.*llava"):
            VisionProcessor.from_dir(other, vocab_of(other))
