"""Shared fixtures: tiny tokenizers built in tmp dirs (no network, ever) and Zipf-like corpora."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<s>"]
_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this", "are", "from", "at", "or", "an", "which", "packing", "tokens", "sequence", "attention", "model", "training", "data", "batch", "padding", "length", "document", "memory", "kernel", "gradient", "loss", "layer", "python", "numpy", "vector", "matrix", "shard", "pack", "bin", "offset", "héllo", "naïve", "café", "東京", "データ", "🙂", "ünïcödé"]


def zipf_texts(n: int, seed: int = 0, max_words: int = 400) -> list[str]:
    """Real-looking text with Zipf-distributed lengths (many short docs, a long tail)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.6, size=n), max_words)
    probs = 1.0 / np.arange(1, len(_WORDS) + 1)
    probs /= probs.sum()
    out = []
    for length in lengths:
        words = rng.choice(_WORDS, size=int(length), p=probs)
        out.append(" ".join(words).capitalize() + ".")
    return out


def build_bpe_tokenizer(directory: Path, vocab_size: int = 600) -> Path:
    """Train a deterministic byte-level BPE on a fixed corpus; save tokenizer.json + config."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(zipf_texts(400, seed=123), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "chat_template": CHATML_TEMPLATE,
    }))
    return directory


def build_big_vocab_tokenizer(directory: Path, vocab_size: int = 70_000) -> Path:
    """A word-level tokenizer whose ids go above 65,535, so token stores must be uint32."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ["[UNK]"])}
    for word in _WORDS:
        vocab.setdefault(word, len(vocab))
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "chat_template": CHATML_TEMPLATE,
    }))
    return directory


def big_vocab_texts(n: int, seed: int = 0) -> list[str]:
    """Texts whose words map to ids above 65,535 in the big-vocab tokenizer."""
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{j}" for j in rng.integers(60_000, 69_000, size=int(k))) for k in rng.integers(1, 50, size=n)]


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("bpe_tok"))


@pytest.fixture(scope="session")
def big_vocab_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_vocab_tokenizer(tmp_path_factory.mktemp("big_tok"))


def cli(*args: str) -> tuple[int, str, str]:
    """Run the real entry point (`packtool.cli.main`) in-process: (exit code, stdout, stderr)."""
    from packtool.cli import main

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["packtool", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def run_cli(args: list[str], capsys: object = None) -> tuple[int, str, str]:
    """`cli` taking a list (the signature the tokenize tests grew up with; capsys is not needed)."""
    return cli(*args)
