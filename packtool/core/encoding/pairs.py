"""Preference pairs -> two documents each, with TRL 1.16 `DPOTrainer`'s ids and completion targets.

TRL tokenizes three texts per record: the prompt (conversational: rendered with `add_generation_prompt`),
prompt + chosen and prompt + rejected, and cuts the prompt at `min(common_prefix(prompt, prompt+chosen),
common_prefix(prompt, prompt+rejected))` tokens: the completion starts where the tokenized prompt and
the tokenized sequences diverge, which is not always after the prompt (tokens that merge across the
boundary; a template that renders the prompt alone differently). Its forward sequence is
`prompt_ids[:cut] + (prompt+completion ids)[cut:]`, which is the tokenized prompt + completion itself,
so each document here is exactly that tokenization, and its targets (TRL's completion mask) are the
tokens from `cut` on. The three texts of a batch of pairs go to the tokenizer in one call; the common
prefixes are found with a few vectorised numpy passes over the prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from packtool.core.encoding.backends import Backend


class PairTexts(NamedTuple):
    """The three texts TRL tokenizes for one preference record."""

    prompt: str  # conversational: rendered with add_generation_prompt=True
    chosen: str  # the whole chosen sequence: prompt + chosen completion
    rejected: str  # the whole rejected sequence: prompt + rejected completion


def encode_pairs(
    backend: Backend, pairs: Sequence[PairTexts], add_special_tokens: bool, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids of the documents chosen_0, rejected_0, chosen_1, ..., their lengths, uint8 targets)."""
    n = len(pairs)
    texts = [p.prompt for p in pairs] + [t for p in pairs for t in (p.chosen, p.rejected)]
    flat, lengths = backend.encode_flat(texts, add_special_tokens)
    prompt_lengths, lengths = lengths[:n], lengths[n:]
    split = int(prompt_lengths.sum())
    prompts, ids = flat[:split], flat[split:]
    cut = completion_starts(prompts, prompt_lengths, ids, lengths)
    return ids.astype(dtype, copy=False), lengths, targets_from(np.repeat(cut, 2), lengths)


def completion_starts(
    prompts: np.ndarray, prompt_lengths: np.ndarray, ids: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """Per pair, TRL's prompt length: the shorter common prefix of its prompt with its two sequences."""
    pair_of = np.arange(lengths.size) // 2
    shared = common_prefix_lengths(
        prompts, _starts(prompt_lengths)[pair_of], prompt_lengths[pair_of], ids, _starts(lengths), lengths
    )
    return np.minimum(shared[0::2], shared[1::2])


def common_prefix_lengths(
    a: np.ndarray,
    a_starts: np.ndarray,
    a_lengths: np.ndarray,
    b: np.ndarray,
    b_starts: np.ndarray,
    b_lengths: np.ndarray,
) -> np.ndarray:
    """For each i, the common prefix length of `a[a_starts[i]:][:a_lengths[i]]` and the same of `b`."""
    m = np.minimum(a_lengths, b_lengths).astype(np.int64)
    total = int(m.sum())
    out = m.copy()
    if total == 0:
        return out
    first = np.cumsum(m) - m  # where each comparison run starts in the flat arrays below
    within = np.arange(total, dtype=np.int64) - np.repeat(first, m)
    differ = a[np.repeat(a_starts, m) + within] != b[np.repeat(b_starts, m) + within]
    hits = np.flatnonzero(differ)
    if hits.size:
        owner = np.repeat(np.arange(m.size), m)[hits]
        rows, at = np.unique(owner, return_index=True)  # hits are ascending: the first one of each row
        out[rows] = within[hits[at]]
    return out


def targets_from(cut: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint8 per token of documents of `lengths`: 1 from each document's `cut` on."""
    position = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(_starts(lengths), lengths)
    return (position >= np.repeat(cut, lengths)).astype(np.uint8)


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.cumsum(lengths) - lengths
