"""--backend fast for prompt-completion and chat: the same bytes as --backend hf, offsets included."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from support import cli, zipf_texts
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from packtool.core.encoding.backends import FastBackend, HFBackend

pytest.importorskip("fastokens")

MULTI = ["Привет мир", "東京は晴れです", "مرحبا بالعالم", "Ελληνικά", "emoji 🙂👋🏽", "  padded  ", "", "tab\tand\nnewline"]


def build_llama_like(directory: Path) -> Path:
    """Byte-level BPE whose post-processor prepends BOS (Llama 3 style), with an NFC normalizer (Qwen style)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=["<|begin_of_text|>", "<|eot_id|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(zipf_texts(300, seed=5) + MULTI * 30, trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}))
    return directory


def rows(n: int) -> list[dict[str, str]]:
    texts = zipf_texts(2 * n, seed=9)
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        prompt, completion = texts[2 * i], texts[2 * i + 1]
        if i % 3 == 0:
            prompt += " " + MULTI[int(rng.integers(len(MULTI)))]
        if i % 5 == 0:
            completion = " " + MULTI[int(rng.integers(len(MULTI)))] + completion
        if i % 17 == 0:
            completion = unicodedata.normalize("NFD", "café naïve ") + completion  # the normalizer rewrites it
        if i % 23 == 0:
            completion = ""
        out.append({"prompt": prompt, "completion": completion})
    return out


def test_prompt_completion_fast_equals_hf(tmp_path: Path) -> None:
    tok_dir = build_llama_like(tmp_path / "tok")
    data = tmp_path / "pc.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows(400)), "utf-8")
    for backend in ("hf", "fast", "auto"):
        code, _, err = cli("tokenize", str(data), "--tokenizer", str(tok_dir), "--format", "prompt-completion",
                                "--output", str(tmp_path / backend), "--backend", backend, "--workers", "1", "-q")
        assert code == 0, err
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["backend"]["name"] == "fast"
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name
    loss = np.fromfile(tmp_path / "hf" / "tokens.loss", np.uint8)
    assert 0 < loss.mean() < 1


def test_derived_offsets_equal_tokenizers_offsets(tmp_path: Path) -> None:
    tok_dir = build_llama_like(tmp_path / "tok")
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    fast = FastBackend(str(tok_dir / "tokenizer.json"), tok)
    assert fast.offsets_reason is None
    texts = [*MULTI, *zipf_texts(200, seed=4), unicodedata.normalize("NFD", "é à"), "<|eot_id|>x<|begin_of_text|>"]
    for special in (False, True):
        got = fast.encode_offsets(texts, special)
        want = HFBackend(tok).encode_offsets(texts, special)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)


def test_fast_refuses_a_tokenizer_without_byte_level_offsets(tmp_path: Path) -> None:
    """A RoBERTa-style post-processor that trims offsets: fast says why in one line, auto uses hf."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(zipf_texts(200, seed=6), trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["</s>"], show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok_dir = tmp_path / "sp"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    data = tmp_path / "pc.jsonl"
    data.write_text(json.dumps({"prompt": "why", "completion": " because"}) + "\n")
    args = ["tokenize", str(data), "--tokenizer", str(tok_dir), "--format", "prompt-completion", "-q"]
    code, _, err = cli(*args, "--output", str(tmp_path / "f"), "--backend", "fast")
    assert code == 1 and err.startswith("error: --backend fast cannot give the token offsets") and err.count("\n") == 1
    code, _, err = cli(*args, "--output", str(tmp_path / "a"))
    assert code == 0, err
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["backend"]["name"] == "hf"


def test_byte_space_targets_equal_char_space_targets(tmp_path: Path) -> None:
    """Random spans over multilingual text (boundaries inside multi-byte runs, empty spans, NFD
    documents that go back to tokenizers): the fast loss equals the hf loss."""
    tok_dir = build_llama_like(tmp_path / "tok")
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    fast, hf = FastBackend(str(tok_dir / "tokenizer.json"), tok), HFBackend(tok)
    rng = np.random.default_rng(11)
    texts = [*MULTI, *zipf_texts(150, seed=12), unicodedata.normalize("NFD", "é à ü")] * 2
    spans = []
    for text in texts:
        cuts = sorted(rng.integers(0, len(text) + 1, size=2 * int(rng.integers(0, 4))).tolist())
        spans.append([(cuts[k], cuts[k + 1]) for k in range(0, len(cuts), 2)] or None)
    for special in (False, True):
        got = fast.encode_targets(texts, spans, special)
        want = hf.encode_targets(texts, spans, special)
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)
        assert 0 < got[2].mean() < 1
