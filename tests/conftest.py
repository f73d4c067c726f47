"""Shared fixtures: tiny tokenizers built once per session in tmp dirs (helpers live in support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import build_big_vocab_tokenizer, build_bpe_tokenizer


@pytest.fixture(scope="session")
def bpe_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("bpe_tok"))


@pytest.fixture(scope="session")
def big_vocab_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_big_vocab_tokenizer(tmp_path_factory.mktemp("big_tok"))
