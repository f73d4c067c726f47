"""Verify the images of a token store: every row inside its document, every span of image tokens exactly
the image token, no image token outside a span, every unique image's bytes equal to its sha256.

The files' hashes are checked by `open_token_store(check_hashes=True)`; this re-derives what the rows
promise about the tokens (vectorised, block-wise) and what `images.index` promises about each image.
"""

from __future__ import annotations

import hashlib

import numpy as np

from packtool.errors import FormatError
from packtool.formats.media import BLOBS, ROWS, MediaTable, runs
from packtool.formats.token_store import TOKENS_BIN, TokenStore

#: image rows whose token spans are gathered per block (bounded memory)
BLOCK_IMAGES = 1 << 14
#: tokens counted per block
BLOCK_TOKENS = 1 << 22
RETOK = "re-run `packtool tokenize`"


def verify_media(store: TokenStore) -> str:
    """'' for a text-only store; else a line of what was checked (FormatError at the first failure)."""
    table = store.media  # rows validated among themselves and against the documents
    if table is None:
        return ""
    tid = table.image_token_id
    starts = store.starts
    for a in range(0, len(table), BLOCK_IMAGES):
        b = min(len(table), a + BLOCK_IMAGES)
        begin = starts[table.doc[a:b]] + np.asarray(table.offset[a:b])
        ids = np.asarray(store.tokens[runs(begin, table.n_tokens[a:b])])
        if ids.size and bool(np.any(ids != tid)):
            k = int(np.argmax(ids != tid))
            i = a + int(np.searchsorted(np.cumsum(table.n_tokens[a:b]), k, side="right"))
            raise FormatError(
                f"image row {i} (document {int(table.doc[i])}, offset {int(table.offset[i])}) spans a token that is "
                f"not the image token {tid}, {store.path / ROWS}, {RETOK}"
            )
    count = sum(
        int(np.count_nonzero(np.asarray(store.tokens[a : a + BLOCK_TOKENS]) == tid))
        for a in range(0, store.n_tokens, BLOCK_TOKENS)
    )
    held = int(np.asarray(table.n_tokens).sum(dtype=np.int64))
    if count != held:
        raise FormatError(
            f"{count} image tokens (id {tid}) in the documents but the image rows account for {held} "
            f"(an image token outside any image), {store.path / TOKENS_BIN}, {RETOK}"
        )
    _check_blobs(table)
    return f"{len(table)} images ({int(table.index.size)} unique), {held} image tokens, {int(table.n_patches.sum())} patches"


def _check_blobs(table: MediaTable) -> None:
    ends = np.asarray(table.index["end"], np.int64)
    lo = 0
    for u, hi in enumerate(ends.tolist()):
        if hashlib.sha256(np.ascontiguousarray(table.blobs[lo:hi]).tobytes()).digest() != bytes(
            table.index["sha256"][u]
        ):
            raise FormatError(
                f"unique image {u} (bytes {lo}..{hi}) does not match its sha256 (corrupted), {table.path / BLOBS}, {RETOK}"
            )
        lo = hi
