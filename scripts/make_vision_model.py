"""Build the shipped tiny vision-language model folder, data/sample/vision_model/qwen2_vl_tiny/, reproducibly.

What it holds (a few KB, every file committed; `make demo` never regenerates it):
  tokenizer.json            byte-level BPE (vocabulary 384: 256 bytes, merges learned from the mllm demo's
                            text, and Qwen2-VL's 7 special tokens), trained deterministically
  tokenizer_config.json     eos / pad tokens and Qwen2-VL's real chat template
                            (tests/fixtures/chat_templates/qwen2_vl.json: Qwen/Qwen2-VL-7B-Instruct's)
  chat_template.jinja       the same template, where a transformers processor reads it
  preprocessor_config.json  Qwen2VLImageProcessor settings, 14-pixel patches, 2x2 merge, max_pixels 28*28*16
                            (at most 16 image tokens per image: fast on a CPU)
  config.json               a tiny Qwen2VLForConditionalGeneration (2 text layers of width 32, 1 vision block)

NO weights are shipped: scripts/train_vision.py (and the tests) build the model from config.json with a
fixed seed (`torch.manual_seed(0)` then `Qwen2VLForConditionalGeneration(config)`), so a run is reproducible.

Run: python scripts/make_vision_model.py [--out data/sample/vision_model/qwen2_vl_tiny]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2_vl.json"
DEMO = ROOT / "data" / "sample" / "vision" / "mllm_demo.json"
VOCAB_SIZE = 384
PATCH, MERGE, TEMPORAL = 14, 2, 2
PREPROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
    "min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16, "merge_size": MERGE, "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL, "resample": 3, "rescale_factor": 0.00392156862745098,
}  # fmt: skip
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "use_cache": False,
        "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}}  # fmt: skip
VISION = {"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 32, "mlp_ratio": 2, "in_chans": 3,
          "patch_size": PATCH, "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL}  # fmt: skip


def corpus() -> list[str]:
    """The demo's own text (every turn) plus the template's fixed phrases: what the merges are learned from."""
    records = json.loads(DEMO.read_text("utf-8"))
    texts = [m["content"].replace("<image>", "") for r in records for m in r["messages"]]
    return [*texts, "system\nYou are a helpful assistant.\n", "user\n", "assistant\n"] * 4


def build(out: Path) -> None:
    spec = json.loads(TEMPLATE.read_text("utf-8"))
    specials = [t["content"] for t in spec["added_tokens"]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ids = {name: tok.token_to_id(name) for name in specials}
    template = spec["chat_template"]
    write(out / "tokenizer_config.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                          "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template})
    (out / "chat_template.jinja").write_text(template, "utf-8")
    write(out / "preprocessor_config.json", PREPROCESSOR)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    write(out / "config.json", {
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        "tie_word_embeddings": False,
        "text_config": {**TEXT, "vocab_size": vocab, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
                        "pad_token_id": ids["<|endoftext|>"]},
        "vision_config": VISION,
    })  # fmt: skip


def write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n", "utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "sample" / "vision_model" / "qwen2_vl_tiny")
    args = ap.parse_args()
    build(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
