"""Records -> documents -> token ids and loss masks, a batch at a time through the Rust tokenizer.

Every format becomes (text, target character spans): text has no spans (every token is a
target, no loss file); prompt-completion is `prompt + completion` with the completion as the
span; chat is the rendered conversation with the assistant turns as spans. The text is
encoded once with offsets, and a token is a target when its character range overlaps a span
(one `searchsorted` over the whole batch). Encoding the joined string once keeps the ids
byte-identical to `tokenizer.encode(prompt + completion)`, with no seam at the boundary.

The Python work per batch is two C-level flattenings of the ids (and offsets) lists; measured
on 2 cores it is ~5% of the encode time (scripts/bench_tokenize.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from packtool.core.encoding.backends import Backend, HFBackend

Spans = list[tuple[int, int]]


@dataclass(frozen=True)
class SpecialPolicy:
    """How BOS/EOS are handled beyond the tokenizer's own post-processor."""

    add_special_tokens: bool  # run the tokenizer's post-processor (text, prompt-completion)
    prepend: int | None = None  # packtool prepends this id
    append: int | None = None  # packtool appends this id
    strip_first: int | None = None  # remove this id when the post-processor put it first (--no-bos)
    strip_last: int | None = None  # remove this id when the post-processor put it last (--no-eos)
    manifest: dict[str, Any] = field(default_factory=dict, compare=False)


def encode_batch(
    tok: Tokenizer | None,
    texts: Sequence[str],
    spans: Sequence[Spans | None] | None,
    policy: SpecialPolicy,
    dtype: np.dtype,
    backend: Backend | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Encode documents: (concatenated ids, per-document lengths, per-token loss or None).

    The ids (and, with spans, the character offsets of the tokens) come from `backend`: hf or
    the verified fast engine, whose offsets are checked per document (see backends.py).
    """
    if backend is None and tok is None:
        raise ValueError("encode_batch needs a tokenizer or a backend, this is a bug")
    engine = backend or HFBackend(tok)  # type: ignore[arg-type]
    if spans is None:
        flat, lengths = engine.encode_flat(texts, policy.add_special_tokens)
        return frame(flat.astype(dtype, copy=False), lengths, None, policy)
    flat, lengths, loss = engine.encode_targets(texts, spans, policy.add_special_tokens)
    return frame(flat.astype(dtype, copy=False), lengths, loss, policy)


def frame(
    ids: np.ndarray, lengths: np.ndarray, loss: np.ndarray | None, policy: SpecialPolicy
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Strip post-processor BOS/EOS the user turned off, then add packtool's BOS/EOS (vectorised)."""
    ends = np.cumsum(lengths)
    starts = ends - lengths
    keep = None
    for strip, at in ((policy.strip_first, starts), (policy.strip_last, ends - 1)):
        if strip is None or not ids.size:
            continue
        keep = np.ones(ids.size, bool) if keep is None else keep
        safe = np.clip(at, 0, ids.size - 1)
        hit = (lengths > 0) & (ids[safe] == strip) & keep[safe]
        keep[at[hit]] = False
        lengths = lengths - hit
    if keep is not None:
        ids = ids[keep]
        loss = None if loss is None else loss[keep]
    pre, post = int(policy.prepend is not None), int(policy.append is not None)
    if not (pre or post):
        return ids, lengths, loss
    new_lengths = lengths + pre + post
    new_ends = np.cumsum(new_lengths)
    slot = np.ones(int(new_ends[-1]) if new_ends.size else 0, bool)  # where the tokenizer's ids go
    if pre:
        slot[new_ends - new_lengths] = False
    if post:
        slot[new_ends - 1] = False
    out = np.empty(slot.size, ids.dtype)
    out[slot] = ids  # a boolean-mask copy: ~10x faster than scattering through an int64 position array
    new_loss = None
    if loss is not None:
        new_loss = np.zeros(out.size, np.uint8)
        new_loss[slot] = loss
    if pre:
        out[new_ends - new_lengths] = policy.prepend
    if post:
        out[new_ends - 1] = policy.append
        if new_loss is not None:
            new_loss[new_ends - 1] = 1  # EOS is a prediction target in every format
    return out, new_lengths, new_loss
