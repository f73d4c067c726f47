"""The tokenize stage: raw records -> a token store (`packtool tokenize`).

config (`TokenizeConfig.validate`) -> plan (sources, chunks, shards, backend choice) -> tasks
(`ChunkTask`, one chunk each, journaled for resume) -> commit (`write_token_store`).
"""

from __future__ import annotations

from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.pipeline import TokenizeResult, tokenize_corpus
from packtool.stages.tokenize.tokenizer import TokenizerInfo, load_tokenizer

__all__ = ["TokenizeConfig", "TokenizeResult", "TokenizerInfo", "load_tokenizer", "tokenize_corpus"]
