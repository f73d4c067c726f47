"""Which global documents each split of a mixture holds (training with repetition, validation once).

The rules live in `packtool.core.mixture`; this module applies them to a `StoreSet` and describes
the result per source for the metadata line. `verify --source` calls `select_splits` too, to
re-derive every document's expected number of occurrences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packtool.core.mixture import CONTENT_HASH, content_hashes, repeat_documents, validation_threshold
from packtool.formats.store_set import StoreSet


@dataclass(frozen=True)
class SplitSelection:
    """The global documents of one split, in packing input order (repeats included)."""

    split: str
    part: str  # "training" or "validation": its role in a `--validation` run
    docs: np.ndarray  # int64 global document indices


def select_splits(
    stores: StoreSet, weights: list[float], seed: int, validation: float | None, training_split: str = "training"
) -> list[SplitSelection]:
    """Training (weights applied) and, with `validation`, the held-out documents (each once).

    Held-out documents are removed before repetition, so no repeat of them reaches training.
    """
    keys = [s.manifest_sha256 for s in stores.stores]
    threshold = validation_threshold(validation) if validation is not None else None
    train, held = [], []
    for i, (store, weight) in enumerate(zip(stores.stores, weights, strict=True)):
        offset = int(stores.doc_offsets[i])
        local = np.arange(store.n_documents, dtype=np.int64)
        if threshold is not None:
            is_val = content_hashes(store.tokens, store.starts, store.lengths) < threshold
            held.append(local[is_val] + offset)
            local = local[~is_val]
        train.append(repeat_documents(local, weight, seed, keys[i], keys[:i].count(keys[i])) + offset)
    empty = np.zeros(0, np.int64)
    out = [SplitSelection(training_split, "training", np.concatenate(train) if train else empty)]
    if threshold is not None:
        out.append(SplitSelection("validation", "validation", np.concatenate(held) if held else empty))
    return out


def occurrences(stores: StoreSet, docs: np.ndarray) -> np.ndarray:
    """int64 [n_global_documents]: how many times each global document is in `docs`."""
    return np.bincount(np.asarray(docs, np.int64), minlength=stores.n_documents).astype(np.int64)


def source_records(
    stores: StoreSet, weights: list[float], selection: SplitSelection, validation: float | None
) -> list[dict[str, Any]]:
    """One metadata record per source: identity, weight, offsets, and what this split holds of it."""
    lengths = stores.lengths
    which = stores.store_of_docs(selection.docs)
    n_docs = np.bincount(which, minlength=len(stores.stores))
    n_toks = np.bincount(which, weights=lengths[selection.docs], minlength=len(stores.stores)).astype(np.int64)
    total = int(n_toks.sum())
    out = []
    for i, (store, weight) in enumerate(zip(stores.stores, weights, strict=True)):
        out.append(
            {
                "path": str(store.path.resolve()),
                "manifest_sha256": store.manifest_sha256,
                "weight": weight,
                "documents": int(n_docs[i]),
                "tokens": int(n_toks[i]),
                "share": round(int(n_toks[i]) / total, 6) if total else 0.0,
                "store_documents": store.n_documents,
                "store_tokens": store.n_tokens,
                "doc_offset": int(stores.doc_offsets[i]),
                "token_offset": int(stores.token_offsets[i]),
            }
        )
    return out


def mixture_record(selection: SplitSelection, validation: float | None, training_split: str) -> dict[str, Any]:
    """The `mixture` key: how the split was chosen (enough for verify to re-derive it with the sources);
    a validation part names the split its documents were held out of."""
    rec: dict[str, Any] = {"rule": "weights-v1", "part": selection.part}
    if validation is not None:
        rec["validation"] = {"fraction": validation, "hash": CONTENT_HASH, "training_split": training_split}
    return rec


def held_out_of(record: dict[str, Any]) -> str | None:
    """The training split a `--validation` run's validation line was held out of (None for other lines)."""
    mixture = record.get("mixture")
    if not isinstance(mixture, dict) or mixture.get("part") != "validation":
        return None
    validation = mixture.get("validation")
    return str(validation.get("training_split", "training")) if isinstance(validation, dict) else "training"
