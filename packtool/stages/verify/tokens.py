"""Verify a token store: hashes, sizes and boundaries (`open_token_store`), then ids, loss bits, counts.

Vectorised and block-wise (`BLOCK_TOKENS` ids at a time): bounded memory, no per-document loop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packtool.errors import FormatError
from packtool.formats.token_store import LOSS as TOKENS_LOSS
from packtool.formats.token_store import MANIFEST, TOKENS_BIN, TokenStore, open_token_store
from packtool.progress import Progress
from packtool.stages.verify.media import verify_media

#: positions checked per block (bounded memory: a few int64 index arrays of this size)
BLOCK_TOKENS = 1 << 22
RETOK = "re-run `packtool tokenize`"


def _id_bound(store: TokenStore) -> int:
    """Smallest id the tokenizer can NOT emit: `max_id + 1` when recorded, else `vocab_size`, else the dtype's."""
    tok = store.manifest.get("tokenizer") or {}
    for key, plus in (("max_id", 1), ("vocab_size", 0)):
        value = tok.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value + plus
    return int(np.iinfo(store.dtype).max) + 1


def verify_token_store(path: Path, progress: Progress | None = None) -> tuple[TokenStore, str]:
    """Hashes, sizes, boundaries (via `open_token_store`), then ids, loss bits and the target count."""
    store = open_token_store(path, check_hashes=True)
    root, m = store.path, store.manifest
    if int(m["n_documents"]) != store.n_documents or int(m["n_tokens"]) != store.n_tokens:
        raise FormatError(
            f"manifest counts ({m['n_documents']} documents, {m['n_tokens']} tokens) differ from the files "
            f"({store.n_documents}, {store.n_tokens}), {root / MANIFEST}, {RETOK}"
        )
    pairs = store.preference_pairs  # a preference store: 2 documents per pair, or a FormatError naming the mismatch
    bound = _id_bound(store)
    n, targets = store.n_tokens, 0
    for a in range(0, n, BLOCK_TOKENS):
        b = min(n, a + BLOCK_TOKENS)
        ids = np.asarray(store.tokens[a:b])
        if int(ids.max()) >= bound:
            k = a + int(np.argmax(ids >= bound))
            doc = int(np.searchsorted(store.boundaries, k, side="right"))
            raise FormatError(
                f"token {k} (document {doc}) is id {int(store.tokens[k])}, expected < {bound} (the tokenizer's "
                f"vocabulary), {root / TOKENS_BIN}, {RETOK} with the right tokenizer"
            )
        if store.loss is not None:
            bits = np.asarray(store.loss[a:b])
            if int(bits.max()) > 1:
                k = a + int(np.argmax(bits > 1))
                raise FormatError(
                    f"loss value {int(store.loss[k])} at token {k}, expected 0 or 1, {root / TOKENS_LOSS}, {RETOK}"
                )
            targets += int(np.count_nonzero(bits))
        if progress is not None:
            progress(b, n)
    if store.loss is None:
        targets = n
    if int(m.get("n_target_tokens", targets)) != targets:
        raise FormatError(
            f"manifest n_target_tokens is {m.get('n_target_tokens')} but the loss mask holds {targets} targets, "
            f"{root / MANIFEST}, {RETOK}"
        )
    line = f"{store.n_documents} documents, {n} tokens ({store.dtype.name}, ids < {bound}), {targets} targets"
    images = verify_media(store)
    return store, line + (f", {pairs} preference pairs" if pairs is not None else "") + (
        f", {images}" if images else ""
    )
