"""Preference token stores for the pack/loader tests, written through the library's token-store writer.

Pair i is documents 2i (chosen) and 2i+1 (rejected): prompt ids + completion ids, `tokens.loss` 1 on the
completion only, and the manifest's `preference` key (the contract of `tokenize --format preference`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id
from tests.support import EOS, PAD

Pair = tuple[np.ndarray, np.ndarray, np.ndarray]  # prompt, chosen completion, rejected completion


def write_pref_store(path: Path, pairs: list[Pair], *, vocab: int = 600, tokenizer_sha: str = "0" * 64) -> Path:
    """A preference token store holding exactly `pairs`."""
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, dtype_for_max_id(vocab - 1))
    ids, lengths, loss = [], [], []
    for prompt, chosen, rejected in pairs:
        for completion in (chosen, rejected):
            ids += [prompt, completion]
            loss += [np.zeros(prompt.size, np.uint8), np.ones(completion.size, np.uint8)]
            lengths.append(prompt.size + completion.size)
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    writer.append(flat, np.asarray(lengths, np.int64), np.concatenate(loss) if loss else np.zeros(0, np.uint8))
    writer.finish(
        {
            "packtool_version": "test",
            "input_format": "preference",
            "tokenizer": {
                "name": "org/tiny-tok",
                "sha256": tokenizer_sha,
                "vocab_size": vocab,
                "bos_id": None,
                "eos_id": EOS,
                "pad_id": PAD,
            },
            "preference": {"pairs": len(pairs), "layout": "chosen,rejected"},
        }
    )
    return path


def realistic_pairs(
    n: int, seed: int = 0, vocab: int = 600, prompt_cap: int = 1500, completion_cap: int = 900, scale: float = 1.0
) -> list[Pair]:
    """Lognormal-ish prompts and completions with a Zipf tail (UltraFeedback-like shapes), random ids."""
    rng = np.random.default_rng(seed)
    p = np.minimum(np.maximum(1, (rng.lognormal(4.5, 1.0, n) * scale).astype(np.int64)), prompt_cap)
    c = np.minimum(np.maximum(1, (rng.lognormal(5.0, 0.8, n) * scale).astype(np.int64)), completion_cap)
    r = np.minimum(np.maximum(1, (rng.lognormal(5.0, 0.8, n) * scale).astype(np.int64)), completion_cap)
    tail = rng.random(n) < 0.02
    c[tail] = np.minimum(rng.zipf(1.3, int(tail.sum())) * 40, completion_cap)
    out = []
    for i in range(n):
        prompt = rng.integers(2, vocab, p[i])
        chosen = rng.integers(2, vocab, c[i])
        rejected = rng.integers(2, vocab, r[i])
        rejected[0] = chosen[0] + 1 if chosen[0] + 1 < vocab else 2  # completions diverge at once
        out.append((prompt, chosen, rejected))
    return out


def hostile_pairs(vocab: int = 600, seed: int = 1) -> list[Pair]:
    """Empty completions, identical chosen and rejected, a long prompt, one-token sequences."""
    rng = np.random.default_rng(seed)
    ids = lambda n: rng.integers(2, vocab, n)  # noqa: E731
    same = ids(7)
    return [
        (ids(5), ids(3), ids(4)),
        (ids(6), np.zeros(0, np.int64), ids(2)),  # empty chosen completion
        (ids(6), ids(2), np.zeros(0, np.int64)),  # empty rejected completion
        (ids(4), same, same.copy()),  # identical chosen and rejected
        (np.zeros(0, np.int64), ids(3), ids(5)),  # no prompt
        (ids(1), np.zeros(0, np.int64), np.zeros(0, np.int64)),  # both completions empty: sequences = prompt
        (ids(9), ids(1), ids(1)),
    ]
