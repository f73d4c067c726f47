"""Raw records -> token store: tokenizer loading, formats (text, prompt-completion, chat), chunked pipeline."""

from __future__ import annotations

from packtool.tokenization.executor import ChunkTask, Executor, local_executor
from packtool.tokenization.loading import TokenizerInfo, load_tokenizer
from packtool.tokenization.pipeline import TokenizeResult, tokenize_corpus
from packtool.tokenization.settings import TokenizeConfig

__all__ = [
    "ChunkTask",
    "Executor",
    "TokenizeConfig",
    "TokenizeResult",
    "TokenizerInfo",
    "load_tokenizer",
    "local_executor",
    "tokenize_corpus",
]
