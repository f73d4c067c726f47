"""Model folders of the shape the hub ships (Qwen/Qwen2-VL-2B-Instruct, google/gemma-3-4b-it), without the real
tokenizer files: scripts/check_real_vision.py runs the same checks on the real ones (docs/VISION_REAL.md).

Each folder holds the checkpoint's own `preprocessor_config.json`, `config.json`, `chat_template.json` (and
Gemma 3's `processor_config.json`), as scripts/check_real_vision.py writes them, beside a TINY tokenizer with the
real tokenizer's layout: its normalizer / pre-tokenizer / post-processor / decoder, and its special tokens at
their REAL ids (Qwen's 22 added tokens from 151643 on, `<|image_pad|>` 151655; Gemma's `<bos>` 2,
`<start_of_turn>` 105, `<start_of_image>` 255999, `<end_of_image>` 256000, `<image_soft_token>` 262144), the
vocabulary padded with unused entries, so every id and every config key is what a real folder gives. Its
`tokenizer_config.json` has the real one's keys: Qwen2.5's (its TEXT template, which `chat_template.json` must
win over), Gemma 3's (`add_bos_token`, `boi_token` / `eoi_token` / `image_token` at the top level and in
`extra_special_tokens`).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from packtool.vision import VisionProcessor

pytest.importorskip("transformers")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
              "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
              "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
              "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
QWEN_PIPELINE = {  # Qwen2.5's tokenizer.json, as it is
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
                                               "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
}
GEMMA_SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 5: "[multimodal]",
                  105: "<start_of_turn>", 106: "<end_of_turn>", 255999: "<start_of_image>", 256000: "<end_of_image>",
                  262144: "<image_soft_token>"}
GEMMA_PIPELINE = {  # gemma-3's tokenizer.json, as it is
    "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                       "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"}]},
}


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_real_vision", ROOT / "scripts" / "check_real_vision.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_real_vision"] = module
    spec.loader.exec_module(module)
    return module


def corpus() -> list[str]:
    demo = json.loads((ROOT / "data" / "sample" / "vision" / "mllm_demo.json").read_text("utf-8"))
    return [m["content"].replace("<image>", "") for r in demo for m in r["messages"]] * 3 + ["Hello world"] * 5


def padded_tokenizer(trained: Tokenizer, specials: dict[int, str], size: int, pipeline: dict[str, Any]) -> str:
    """tokenizer.json: the trained merges, the real pipeline, the specials at their real ids, `size` ids in all."""
    spec = json.loads(trained.to_str())
    learned = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]) if t not in specials.values()]
    free = (i for i in range(size) if i not in specials)
    vocab = {t: next(free) for t in learned}
    vocab.update({t: i for i, t in specials.items()})
    vocab.update({f"<unused{i}>": i for i in free})
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in sorted(specials.items())]
    spec.update(pipeline)
    return json.dumps(spec, ensure_ascii=False)


def qwen_tokenizer() -> str:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    return padded_tokenizer(tok, {151643 + i: t for i, t in enumerate(QWEN_ADDED)}, 151643, QWEN_PIPELINE)


def gemma_tokenizer() -> str:
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  special_tokens=[f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator(corpus(), trainer=trainer)
    return padded_tokenizer(tok, GEMMA_SPECIALS, 262145, GEMMA_PIPELINE)


def qwen_tokenizer_config() -> dict[str, Any]:
    """Qwen2.5's tokenizer_config.json keys (its chat_template is the TEXT one; the folder's chat_template.json
    holds Qwen2-VL's)."""
    added = {str(151643 + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": i < 14 or i > 15} for i, t in enumerate(QWEN_ADDED)}
    return {"add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
            "additional_special_tokens": QWEN_ADDED[1:14], "bos_token": None,
            "chat_template": json.loads((FIXTURES / "qwen2_5.json").read_text("utf-8"))["chat_template"],
            "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
            "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}


def gemma_tokenizer_config() -> dict[str, Any]:
    """gemma-3's tokenizer_config.json keys (the named image tokens at the top level and in extra_special_tokens)."""
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in GEMMA_SPECIALS.items()}
    names = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    return {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added, **names,
            "bos_token": "<bos>", "chat_template": json.loads((FIXTURES / "gemma3.json").read_text("utf-8"))["chat_template"],
            "clean_up_tokenization_spaces": False, "eos_token": "<end_of_turn>", "extra_special_tokens": names,
            "model_max_length": 32768, "pad_token": "<pad>", "padding_side": "left", "processor_class": "Gemma3Processor",
            "sp_model_kwargs": None, "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer",
            "unk_token": "<unk>", "use_default_system_prompt": False}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"qwen": DIR, "gemma": DIR}: the hub's folder shapes around tiny real-layout tokenizers."""
    check = script()
    tmp = tmp_path_factory.mktemp("real_shapes")
    out = {}
    for kind, text, config in (("qwen", qwen_tokenizer(), qwen_tokenizer_config()),
                               ("gemma", gemma_tokenizer(), gemma_tokenizer_config())):
        src = tmp / f"{kind}_tokenizer"
        src.mkdir()
        (src / "tokenizer.json").write_text(text, "utf-8")
        (src / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
        out[kind] = check.build_folder(kind, src, tmp / f"{kind}_model")
    return out


def vocab_of(folder: Path) -> dict[str, int]:
    return Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)


def test_tiny_tokenizers_have_the_real_layout(folders: dict[str, Path]) -> None:
    qwen = Tokenizer.from_file(str(folders["qwen"] / "tokenizer.json"))
    assert qwen.token_to_id("<|image_pad|>") == 151655 and qwen.token_to_id("<|vision_start|>") == 151652
    assert qwen.get_vocab_size() == 151665
    gemma = Tokenizer.from_file(str(folders["gemma"] / "tokenizer.json"))
    assert [gemma.token_to_id(t) for t in ("<bos>", "<start_of_image>", "<end_of_image>", "<image_soft_token>")] == [
        2, 255999, 256000, 262144]
    assert gemma.encode("Hello world").ids[0] == 2  # the post-processor adds <bos>, as the real one does


def test_real_folder_settings_are_read(folders: dict[str, Path]) -> None:
    """Qwen2-VL-2B-Instruct's config.json has no vision_config.spatial_merge_size (the model's default 2 applies);
    gemma-3's image token and counts come from config.json / processor_config.json / tokenizer_config.json."""
    qwen = VisionProcessor.from_dir(folders["qwen"], vocab_of(folders["qwen"]))
    assert qwen is not None and qwen.family == "qwen2_vl" and qwen.image_token_id == 151655 and qwen.mrope
    gemma = VisionProcessor.from_dir(folders["gemma"], vocab_of(folders["gemma"]))
    assert gemma is not None and gemma.family == "gemma3" and gemma.image_token_id == 262144 and gemma.token_type_ids
    blob = (ROOT / "data" / "sample" / "vision" / "mllm_demo_data" / "1.jpg").read_bytes()
    assert gemma.measure(blob).n_tokens == 256
    info = qwen.measure(blob)
    assert info.n_tokens * 4 == info.n_patches == int(np.prod(info.grid))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen", "gemma"])
def test_demo_through_the_cli_equals_transformers(folders: dict[str, Path], kind: str, tmp_path: Path) -> None:
    """LLaMA-Factory's mllm demo (its json and the `datasets` Parquet shape) through `packtool tokenize --format
    auto`, `pack --size 4096` (with and without --vision-budget), `verify` and `PackedDataset`: ids, targets, image
    counts / offsets / grids / bytes, pixel_values, M-RoPE rows (get_rope_index of a Qwen2VLModel with the real
    vocab size and token ids) and token_type_ids equal transformers' processor on each record alone."""
    check = script()
    folder = check.Folder(kind, folders[kind])
    demo, names = check.demo_records()
    paths = [check.SAMPLE / n for n in sorted(names, key=names.get)]
    blobs = [p.read_bytes() for p in paths]
    keys = [("demo", i) for i in range(len(demo))]
    for name in ("mllm_demo.json", "mllm_demo.parquet"):
        result = check.check_store(folder, name.replace(".", "_"), check.SAMPLE / name, demo, keys, paths, blobs,
                                   tmp_path)
        assert result["ok"], (name, result["line"], result.get("problems"))
        assert "ids 6/6, targets 6/6, images 6/6" in result["line"]
    for budget in (None, 8192):
        good, line = check.check_packs(folder, "demo", result, demo, budget, tmp_path)
        assert good, line
