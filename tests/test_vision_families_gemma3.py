"""Gemma 3 adapter (packtool.vision.gemma3) against transformers' `Gemma3Processor` around
`Gemma3ImageProcessorPil`, on a tiny folder in tmp_path with Gemma 3's real chat template
(tests/fixtures/chat_templates/gemma3.json): ids, pixel_values (bit for bit) and token_type_ids equal,
for images of many modes, adjacent images and images at turn boundaries, where the `\\n\\n` the
processor adds around each image merges with the neighbouring text under BPE.
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

from packtool.errors import ConfigError, InputError
from packtool.vision import ImageInfo, VisionProcessor

FIXTURE = Path(__file__).parent / "fixtures" / "chat_templates" / "gemma3.json"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
            "<image_soft_token>"]
EXTRA = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
N_TOKENS = 16


def build_gemma_folder(directory: Path, **preprocessor: Any) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["Look at this:\n\n", "\n\n\n\n", "What is it?\n\nA cat.\n\n\n", "Compare them.\n\n"] * 30
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    spec = json.loads(FIXTURE.read_text("utf-8"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "chat_template": spec["chat_template"],
        "extra_special_tokens": EXTRA, "tokenizer_class": "PreTrainedTokenizerFast"}))  # tokenizer.json as it is
    (directory / "chat_template.jinja").write_text(spec["chat_template"])  # where the processor reads it
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": N_TOKENS, "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 0.00392156862745098, "size": {"height": 64, "width": 64}, **preprocessor}))
    (directory / "processor_config.json").write_text(json.dumps({
        "image_seq_length": N_TOKENS, "processor_class": "Gemma3Processor"}))
    (directory / "config.json").write_text(json.dumps({
        "model_type": "gemma3", "mm_tokens_per_image": N_TOKENS, "image_token_index": tok.token_to_id("<image_soft_token>"),
        "vision_config": {"patch_size": 16, "image_size": 64}}))
    return directory


def vocab_of(directory: Path) -> dict[str, int]:
    return Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab(with_added_tokens=True)


def images(seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for mode, (w, h), fmt in [("RGB", (123, 77), "PNG"), ("RGBA", (40, 300), "PNG"), ("L", (64, 64), "PNG"),
                              ("P", (90, 50), "PNG"), ("CMYK", (33, 45), "JPEG"), ("LA", (1, 1), "PNG")]:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA").convert(mode)
        buf = io.BytesIO()
        img.save(buf, fmt)
        out.append(buf.getvalue())
    return out


def reference_processor(folder: Path) -> Any:
    """`AutoProcessor.from_pretrained(folder)`, the PIL image processor named (the same with or without torchvision)."""
    transformers = pytest.importorskip("transformers")
    processor = transformers.AutoProcessor.from_pretrained(str(folder), backend="pil")
    assert type(processor).__name__ == "Gemma3Processor"
    assert type(processor.image_processor).__name__ == "Gemma3ImageProcessorPil"
    assert processor.image_seq_length == N_TOKENS
    return processor


def conversations(paths: list[Path]) -> list[list[dict[str, Any]]]:
    def img(i: int) -> dict[str, Any]:
        return {"type": "image", "path": str(paths[i])}

    def txt(t: str) -> dict[str, Any]:
        return {"type": "text", "text": t}

    return [
        [{"role": "user", "content": [txt("Look at this:"), img(0), txt("What is it?")]},
         {"role": "assistant", "content": [txt("A cat.")]}],
        [{"role": "system", "content": [txt("Compare them.")]},
         {"role": "user", "content": [img(1), img(2), img(3)]},  # adjacent: "\n\n\n\n" between blocks
         {"role": "assistant", "content": [txt("Three.")]},
         {"role": "user", "content": [txt("And?"), img(4)]}],
        [{"role": "user", "content": [img(5), img(5)]}],
        [{"role": "user", "content": [txt("No image.")]}, {"role": "assistant", "content": [txt("Fine.")]}],
    ]


def test_ids_pixels_and_token_types_equal_transformers(tmp_path: Path) -> None:
    folder = build_gemma_folder(tmp_path / "model")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None and adapter.family == "gemma3"
    assert adapter.token_type_ids and not adapter.mrope and not adapter.uses_grid
    blobs = images()
    paths = []
    for i, blob in enumerate(blobs):
        paths.append(tmp_path / f"img{i}")
        paths[-1].write_bytes(blob)
    processor = reference_processor(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    merged_boundary = False
    for messages in conversations(paths):
        order = [paths.index(Path(p["path"])) for m in messages for p in m["content"] if p["type"] == "image"]
        ref = processor.apply_chat_template(messages, tokenize=True, return_dict=True)
        text = processor.apply_chat_template(messages, tokenize=False)
        infos = [adapter.measure(blobs[i], f"img{i}") for i in order]
        assert all(i == ImageInfo(n_tokens=N_TOKENS, grid=(1, 4, 4), n_patches=16) for i in infos)
        expanded, _ = adapter.expand(text, None, infos)
        ids = tok.encode(expanded, add_special_tokens=False).ids
        assert ids == list(ref["input_ids"][0]), order
        types = adapter.token_types(np.asarray(ids))
        assert types is not None and types.tolist() == list(ref["token_type_ids"][0])
        assert int(types.sum()) == N_TOKENS * len(order)
        assert adapter.rope_positions(np.asarray(ids), np.zeros((0, 3))) is None
        pixels, grids = adapter.pixel_rows([blobs[i] for i in order])
        assert grids is None
        if order:
            want = np.asarray(ref["pixel_values"])
            assert pixels.shape == want.shape == (len(order), 3, 64, 64) and pixels.dtype == np.float32
            assert float(np.abs(pixels - want).max()) == 0.0
            # tokenizing the pieces around each block apart (expanding ids, not text) gives other ids here:
            pieces = expanded.split("\n\n")
            apart = [t for k, piece in enumerate(pieces) for t in (
                tok.encode(piece, add_special_tokens=False).ids + (tok.encode("\n\n").ids if k < len(pieces) - 1 else []))]
            merged_boundary |= apart != ids
    assert merged_boundary, "the test data must hold a boundary where BPE merges the processor's \\n\\n"


def test_expand_keeps_targets_off_the_image_block(tmp_path: Path) -> None:
    folder = build_gemma_folder(tmp_path / "model")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    text = "<start_of_turn>model\nSee <start_of_image> here<end_of_turn>\n"
    start = text.index("See")
    end = text.index("<end_of_turn>\n", start) + len("<end_of_turn>\n")
    out, spans = adapter.expand(text, [(start, end)], [adapter.measure(images()[0])])
    assert spans is not None and [out[a:b] for a, b in spans] == ["See ", " here<end_of_turn>\n"]
    assert "\n\n<start_of_image>" + "<image_soft_token>" * N_TOKENS + "<end_of_image>\n\n" in out
    with pytest.raises(InputError, match="miscounted") as more:
        adapter.expand(text + "<start_of_image>", None, [adapter.measure(images()[0])])
    assert "left some images out" not in str(more.value)
    # an image in a system turn: Gemma 3's template renders only that turn's first text part, the image is gone
    with pytest.raises(InputError, match="left some images out.*system turn"):
        adapter.expand("<start_of_turn>user\nHi<end_of_turn>\n", None, [adapter.measure(images()[0])])
    with pytest.raises(InputError, match="literal special token '<image_soft_token>'"):
        adapter.expand(text + "<image_soft_token>", None, [adapter.measure(images()[0])])


def test_pan_and_scan_and_mismatched_folders_are_refused(tmp_path: Path) -> None:
    folder = build_gemma_folder(tmp_path / "pas", do_pan_and_scan=True)
    with pytest.raises(ConfigError, match="pan-and-scan.*not supported"):
        VisionProcessor.from_dir(folder, vocab_of(folder))
    folder = build_gemma_folder(tmp_path / "len")
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3", "mm_tokens_per_image": 256}))
    with pytest.raises(ConfigError, match="mm_tokens_per_image"):
        VisionProcessor.from_dir(folder, vocab_of(folder))
    vocab = {k: v for k, v in vocab_of(folder).items() if k != "<end_of_image>"}
    (folder / "config.json").write_text(json.dumps({"model_type": "gemma3"}))
    with pytest.raises(ConfigError, match="end-of-image token '<end_of_image>'"):
        VisionProcessor.from_dir(folder, vocab)


def test_config_round_trip(tmp_path: Path) -> None:
    folder = build_gemma_folder(tmp_path / "model")
    adapter = VisionProcessor.from_dir(folder, vocab_of(folder))
    assert adapter is not None
    rebuilt = VisionProcessor.from_config(json.loads(json.dumps(adapter.config)))
    square = build_gemma_folder(tmp_path / "square", size=64)  # an integer size is a square, as get_size_dict reads it
    assert VisionProcessor.from_dir(square, vocab_of(square)) == adapter
    assert rebuilt == adapter and rebuilt.replacement(ImageInfo(1, (1, 1, 1), 1)) == adapter.replacement(
        ImageInfo(1, (1, 1, 1), 1))


def test_a_folder_transformers_5_saved_reads_the_same(tmp_path: Path) -> None:
    """`save_pretrained` in transformers 5 nests the image processor in processor_config.json (no
    preprocessor_config.json): read from there, the adapter is the same."""
    transformers = pytest.importorskip("transformers")
    folder = build_gemma_folder(tmp_path / "model")
    saved = tmp_path / "saved"
    transformers.AutoProcessor.from_pretrained(str(folder), backend="pil").save_pretrained(str(saved))
    assert not (saved / "preprocessor_config.json").exists()
    assert "image_processor" in json.loads((saved / "processor_config.json").read_text())
    (saved / "config.json").write_bytes((folder / "config.json").read_bytes())
    assert VisionProcessor.from_dir(saved, vocab_of(saved)) == VisionProcessor.from_dir(folder, vocab_of(folder))
