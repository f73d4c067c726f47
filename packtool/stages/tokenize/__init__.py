"""The tokenize stage: raw records -> a token store (`packtool tokenize`).

config (`TokenizeConfig.validate`) -> plan (sources, chunks, shards, backend choice) -> tasks
(`ChunkTask`, one chunk each, journaled for resume) -> commit (`write_token_store`).

Importing the package is light (the config only): `tokenize_corpus` starts loading the fast engine
before it imports the pipeline (`early.py`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.engine.early import drop_fast_load, start_fast_load

if TYPE_CHECKING:
    from packtool.exec import Executor
    from packtool.progress import Progress
    from packtool.stages.tokenize.engine.tokenizer import TokenizerInfo, load_tokenizer
    from packtool.stages.tokenize.pipeline import TokenizeResult

__all__ = ["TokenizeConfig", "TokenizeResult", "TokenizerInfo", "load_tokenizer", "tokenize_corpus"]
_LAZY = {
    "TokenizeResult": "packtool.stages.tokenize.pipeline",
    "TokenizerInfo": "packtool.stages.tokenize.engine.tokenizer",
    "load_tokenizer": "packtool.stages.tokenize.engine.tokenizer",
}


def tokenize_corpus(
    config: TokenizeConfig, progress: Progress | None = None, executor: Executor | None = None
) -> TokenizeResult:
    """Tokenize `config.inputs` into the token store `config.output` (`pipeline.tokenize_corpus`).

    `progress(done_bytes, total_bytes)` is called after each chunk.
    """
    config.validate()
    located = start_fast_load(config.tokenizer, config.backend, config.format)  # the model folder, found once
    try:
        from packtool.stages.tokenize import pipeline

        return pipeline.tokenize_corpus(config, progress, executor, located)
    finally:
        drop_fast_load(located)  # a no-op once the run took it


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'packtool.stages.tokenize' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
