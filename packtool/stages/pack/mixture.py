"""Which global documents each split of a mixture holds (training with repetition, validation once).

The rules live in `packtool.core.mixture`; this module applies them to a `StoreSet` and describes
the result per source for the metadata line. `verify --source` calls `select_splits` too, to
re-derive every document's expected number of occurrences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.mixture import (
    CONTENT_HASH,
    check_share,
    content_hashes,
    repeat_documents,
    repeated_count,
    validation_threshold,
)
from packtool.errors import UsageError
from packtool.formats.store_set import StoreSet

#: peak bytes of packing per document occurrence: `pack STORE:1e6` of 40 documents (4e7 occurrences)
#: peaked at 4.6 GB RSS (scripts/bench_pack.py's machine, 2 cores)
BYTES_PER_OCCURRENCE = 112


@dataclass(frozen=True)
class SplitSelection:
    """The global documents of one split, in packing input order (repeats included)."""

    split: str
    part: str  # "training" or "validation": its role in a `--validation` run
    docs: np.ndarray  # int64 global document indices


def select_splits(
    stores: StoreSet,
    weights: list[float],
    seed: int,
    validation: float | None,
    training_split: str = "training",
    pairs: bool = False,
) -> list[SplitSelection]:
    """Training (weights applied) and, with `validation`, the held-out documents (each once).

    Held-out documents are removed before repetition, so no repeat of them reaches training.
    `pairs` (preference stores): the unit is the pair (documents 2i, 2i+1, contiguous in tokens.bin): its
    hash covers both sequences, it is repeated or held out whole, and `docs` lists chosen, rejected, ...
    """
    keys = [s.manifest_sha256 for s in stores.stores]
    threshold = validation_threshold(validation) if validation is not None else None
    unit = 2 if pairs else 1
    held, eligible = [], []
    for i, store in enumerate(stores.stores):
        local = np.arange(store.n_documents // unit, dtype=np.int64)
        if threshold is not None:
            starts, lengths = store.starts, store.lengths
            if pairs:  # one span per pair: chosen then rejected
                starts, lengths = starts[0::2], lengths[0::2] + lengths[1::2]
            is_val = content_hashes(store.tokens, starts, lengths) < threshold
            held.append(local[is_val] + int(stores.doc_offsets[i]) // unit)
            local = local[~is_val]
        eligible.append(local)
    for store, weight, local in zip(stores.stores, weights, eligible, strict=True):  # `A:1e-9`: none of A
        check_share(weight, int(local.size), str(store.path), unit="pair" if pairs else "document")
    check_repetition([s.path for s in stores.stores], weights, [e.size * unit for e in eligible])
    train = [
        repeat_documents(local, weight, seed, keys[i], keys[:i].count(keys[i])) + int(stores.doc_offsets[i]) // unit
        for i, (local, weight) in enumerate(zip(eligible, weights, strict=True))
    ]
    empty = np.zeros(0, np.int64)

    def docs_of(parts: list[np.ndarray]) -> np.ndarray:
        units = np.concatenate(parts) if parts else empty
        return np.stack([2 * units, 2 * units + 1], axis=1).reshape(-1) if pairs else units

    out = [SplitSelection(training_split, "training", docs_of(train))]
    if threshold is not None:
        out.append(SplitSelection("validation", "validation", docs_of(held)))
    return out


def check_repetition(paths: list[Path], weights: list[float], eligible: list[int]) -> None:
    """Refuse, before allocating, weights whose document occurrences would not fit in this machine's memory.

    Packing holds ~`BYTES_PER_OCCURRENCE` bytes per document occurrence at its peak (selection, segment
    table, packer arrays, pack order); `pack A:1e9` on a few thousand documents would need terabytes.
    """
    counts = [repeated_count(w, n) for w, n in zip(weights, eligible, strict=True)]
    total = sum(counts)
    need = total * BYTES_PER_OCCURRENCE
    memory = physical_memory()
    if memory is None or need <= memory:
        return
    worst = max(range(len(counts)), key=counts.__getitem__)
    raise UsageError(
        f"the mixture weights give {_count(total)} document occurrences to pack (about {_count(need >> 30)} GiB at "
        f"~{BYTES_PER_OCCURRENCE} bytes each), more than this machine's {memory >> 30} GiB of memory; "
        f"{paths[worst]}:{weights[worst]:g} alone repeats {eligible[worst]:,} documents into "
        f"{_count(counts[worst])}, lower its weight (epochs of that store)"
    )


def _count(n: int) -> str:
    """An exact count with thousands separators, or 3 significant digits when it is astronomically large."""
    return f"{n:,}" if n < 10**15 else f"{n:.3e}" if n < 10**300 else f"about 10^{len(str(n)) - 1}"


def physical_memory() -> int | None:
    """Bytes of RAM of this machine, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


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
