"""Shared fixtures: tiny tokenizers built once per session in tmp dirs (helpers live in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import big_vocab_texts, build_big_vocab_tokenizer, build_bpe_tokenizer, cli, tokenize_records, zipf_texts


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("bpe_tok"))


@pytest.fixture(scope="session")
def big_vocab_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_vocab_tokenizer(tmp_path_factory.mktemp("big_tok"))


@pytest.fixture(scope="session")
def document_stores(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path,
                    big_vocab_tokenizer_dir: Path) -> dict[str, Path]:
    """Token stores built by the real `packtool tokenize`, for the document-level loader modes:
    `text` (Zipf lengths, long tail, empty documents: --no-eos), `pc` (prompt-completion: a
    tokens.loss file, targets only on completions), `u32` (ids above 65,535: a uint32 store)."""
    tmp = tmp_path_factory.mktemp("doc_stores")
    texts = zipf_texts(300, seed=21)
    texts[5] = texts[77] = texts[150] = ""
    prompts, completions = zipf_texts(200, seed=22, max_words=120), zipf_texts(200, seed=23, max_words=80)
    return {
        "text": tokenize_records(tmp / "text", [{"text": t} for t in texts], bpe_tokenizer_dir, "--no-eos"),
        "pc": tokenize_records(tmp / "pc", [{"prompt": p, "completion": c} for p, c in zip(prompts, completions, strict=True)],
                               bpe_tokenizer_dir, "--format", "prompt-completion"),
        "u32": tokenize_records(tmp / "u32", [{"text": t} for t in big_vocab_texts(120, seed=24)], big_vocab_tokenizer_dir),
    }


@pytest.fixture(scope="session")
def cp_stores(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> dict[str, Path]:
    """Pack stores (N = 256) built by the real `packtool tokenize` (prompt-completion: a loss file) and
    `packtool pack`: `cp` (--pad-multiple 8, splittable for cp_size 2 and 4), `plain` (no padding),
    `odd_size` (N = 252, --pad-multiple 4)."""
    tmp = tmp_path_factory.mktemp("cp")
    records = [{"prompt": p, "completion": c} for p, c in zip(zipf_texts(160, 31, 150), zipf_texts(160, 32, 60), strict=True)]
    tok = tokenize_records(tmp / "tok", records, bpe_tokenizer_dir, "--format", "prompt-completion")

    def pack(name: str, *flags: str) -> Path:
        code, _, err = cli("pack", str(tok), "--output", str(tmp / name), "-q", *flags)
        assert code == 0, err
        return tmp / name

    return {
        "cp": pack("cp", "--size", "256", "--pad-multiple", "8"),
        "plain": pack("plain", "--size", "256"),
        "odd_size": pack("odd", "--size", "252", "--pad-multiple", "4"),
    }


@pytest.fixture(scope="session")
def tiny_lm() -> type:
    """The project's tiny causal LM (`scripts/train_plain.py`'s `TinyLM`: RoPE from position_ids,
    GQA attention through `varlen_attention` over cu_seqlens), loaded from the script itself."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "train_plain.py"
    spec = importlib.util.spec_from_file_location("packtool_train_plain", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TinyLM

