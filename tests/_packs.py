"""Test helper: write a small pack store exactly as `packtool.formats.pack_store` describes it.

Independent of the real packer on purpose: the loader tests must pin the loader against the
format, not against another module's choices. Next-fit in the given order, documents longer
than N are split, each segment padded to a multiple of `pad_multiple` with `pad_id`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.formats.pack_store import (
    FORMAT_VERSION,
    companion_name,
    data_name,
    file_names,
    file_records,
    loss_name,
    write_metadata_line,
)


@dataclass
class Segment:
    pack: int
    offset: int  # column where the segment starts in its pack row
    doc: int
    tokens: np.ndarray  # real tokens (no --pad-multiple padding)
    loss: np.ndarray  # uint8 per real token
    pad: int


def zipf_docs(n: int, seed: int = 0, vocab: int = 600, max_len: int = 300, empty_every: int = 0) -> list[np.ndarray]:
    """Token documents with Zipf-like lengths (many short, a long tail); optionally empty ones."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.5, size=n) + 1, max_len)
    if empty_every:
        lengths[::empty_every] = 0
    return [rng.integers(0, vocab, size=int(k)).astype(np.int64) for k in lengths]


def write_pack_store(directory: Path, docs: list[np.ndarray], size: int, *, split: str = "training",
                     losses: list[np.ndarray] | None = None, pad_multiple: int = 1, pad_id: int = 1,
                     dtype: str = "uint16") -> list[Segment]:
    """Pack `docs` and write `{split}_{size}.npy`, companions, optional loss, metadata line."""
    m = pad_multiple
    pieces: list[tuple[int, np.ndarray, np.ndarray]] = []
    for d, doc in enumerate(docs):
        loss = np.ones(doc.size, np.uint8) if losses is None else np.asarray(losses[d], np.uint8)
        if doc.size == 0:
            continue  # empty documents produce no segment
        step = (size // m) * m
        for a in range(0, doc.size, step):
            pieces.append((d, doc[a:a + step], loss[a:a + step]))
    segs: list[Segment] = []
    pack, used = 0, 0
    for d, toks, loss in pieces:
        padded = -(-toks.size // m) * m
        if used + padded > size:
            pack, used = pack + 1, 0
        segs.append(Segment(pack, used, d, toks, loss, padded - toks.size))
        used += padded
    n_packs = pack + 1 if segs else 0
    np_dtype = np.dtype("<u2") if dtype == "uint16" else np.dtype("<u4")
    tokens = np.full((n_packs, size), pad_id, dtype=np_dtype)
    loss_arr = np.zeros((n_packs, size), dtype=np.uint8)
    for s in segs:
        tokens[s.pack, s.offset:s.offset + s.tokens.size] = s.tokens
        loss_arr[s.pack, s.offset:s.offset + s.tokens.size] = s.loss
    counts = np.bincount([s.pack for s in segs], minlength=n_packs)
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / data_name(split, size), tokens)
    companions = {
        "pack_offsets": np.concatenate(([0], np.cumsum(counts))).astype("<i8"),
        "seg_lens": np.array([s.tokens.size + s.pad for s in segs], "<i4"),
        "seg_pad": np.array([s.pad for s in segs], "<i4"),
        "seg_doc": np.array([s.doc for s in segs], "<i8"),
        "seg_src": np.zeros(len(segs), "<i8"),
    }
    for what, arr in companions.items():
        np.save(directory / companion_name(split, size, what), arr)
    with_loss = losses is not None
    if with_loss:
        np.save(directory / loss_name(split, size), loss_arr)
    names = file_names(split, size, with_loss)
    write_metadata_line(directory, {"split": split, "pack_size": size, "dtype": dtype, "pad_id": pad_id,
                                    "format_version": FORMAT_VERSION, "n_packs": n_packs,
                                    "files": file_records(directory, names)})
    return segs
