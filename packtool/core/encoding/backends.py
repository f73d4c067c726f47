"""Tokenizer engines behind one narrow interface, `encode_flat(texts) -> (ids, lengths)`.

`hf` is the Hugging Face `tokenizers` library, the reference for every id packtool writes.
`fast` is `fastokens` (Rust, optional extra `packtool[fast]`), the only one of six evaluated
engines that gave ids identical to `tokenizers` on every test corpus (docs/SCALE.md). It returns
one flat uint32 buffer, so no per-token Python objects are built at all. Which engine a run
uses is the tokenize stage's decision (`packtool.stages.tokenize.backend_choice`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

from packtool.errors import ConfigError, TokenizerError

FAST_PACKAGE = "fastokens"
#: the version whose ids were verified identical to `tokenizers` (docs/SCALE.md)
FAST_VERIFIED_VERSION = "0.3.5"


class Backend(Protocol):
    """What the pipeline needs from a tokenizer engine."""

    name: str

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents: (all ids concatenated as uint32, int64 token count per document)."""
        ...


class HFBackend:
    """`tokenizers.Tokenizer.encode_batch_fast` (no offsets), flattened at C level."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.uint32, count=int(lengths.sum()))
        return ids, lengths


class FastBackend:
    """`fastokens.Tokenizer.encode_batch_flat`: two byte buffers, parallel in Rust."""

    name = "fast"

    def __init__(self, tokenizer_path: str) -> None:
        try:
            import fastokens
        except ImportError as exc:
            raise ConfigError(
                f"--backend fast needs the {FAST_PACKAGE} package, which is not installed, "
                f"pip install 'packtool[fast]' or use --backend hf"
            ) from exc
        try:
            self.tokenizer = fastokens.Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the Rust side raises ValueError/Exception for unsupported pieces
            raise TokenizerError(
                f"{FAST_PACKAGE} cannot load this tokenizer ({exc}), {tokenizer_path}, "
                "use --backend hf (or auto, which falls back by itself)"
            ) from exc

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        raw_ids, raw_offsets = self.tokenizer.encode_batch_flat(list(texts), add_special_tokens=add_special_tokens)
        ids = np.frombuffer(raw_ids, np.dtype("<u4"))
        offsets = np.frombuffer(raw_offsets, np.dtype("<u8")).astype(np.int64)
        return ids, np.diff(offsets)
