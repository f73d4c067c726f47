"""Planning a pack store: segments -> packing algorithm -> where every segment goes (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from packtool.core.packing import pack_lengths
from packtool.core.packing.segments import Segments
from packtool.formats.token_store import TokenStore
from packtool.stages.pack.config import PackConfig


def pad_id_for(store: TokenStore) -> int:
    """Tokenizer pad id, else its eos id, else 0 (what Megatron-Bridge and NeMo-RL fall back to)."""
    tok = store.manifest.get("tokenizer", {})
    for key in ("pad_id", "eos_id"):
        value = tok.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return 0


@dataclass(frozen=True)
class Layout:
    """Where every segment goes: pack CSR plus segment arrays, all in PACK order."""

    pack_offsets: np.ndarray  # int64 [n_packs + 1]
    doc: np.ndarray
    src: np.ndarray
    real: np.ndarray
    pad: np.ndarray
    dst: np.ndarray  # int64: flat position (pack * N + offset) of each segment's first token

    @property
    def n_packs(self) -> int:
        return int(self.pack_offsets.size - 1)

    @property
    def lengths(self) -> np.ndarray:
        return self.real + self.pad


def plan_layout(segments: Segments, config: PackConfig) -> Layout:
    """Run the packing algorithm over segment lengths and place segments in packs."""
    size = config.size
    if len(segments) == 0:
        offsets, order = np.zeros(1, np.int64), np.zeros(0, np.int64)
    else:
        offsets, order = pack_lengths(
            segments.lengths,
            size,
            algorithm=str(config.algorithm),
            seed=config.seed,
            shuffle=config.shuffle,
            max_items_per_pack=config.max_docs_per_pack,
        )
        offsets, order = np.asarray(offsets, np.int64), np.asarray(order, np.int64)
    doc, src, real, pad, dst = _place(order, offsets, segments.doc, segments.src, segments.real, segments.pad, size)
    return Layout(offsets, doc, src, real, pad, dst)


@njit(nogil=True, cache=True)
def _place(
    order: np.ndarray,
    offsets: np.ndarray,
    s_doc: np.ndarray,
    s_src: np.ndarray,
    s_real: np.ndarray,
    s_pad: np.ndarray,
    size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segment arrays in pack order plus each segment's flat destination (pack * N + offset in pack).

    One compiled pass instead of four random gathers and five cumsum/repeat temporaries: at 20M
    documents this step was the slowest of the planning (scripts/bench_pack_write.py).
    """
    n = order.size
    doc = np.empty(n, np.int64)
    src = np.empty(n, np.int64)
    real = np.empty(n, np.int64)
    pad = np.empty(n, np.int64)
    dst = np.empty(n, np.int64)
    for p in range(offsets.size - 1):
        pos = p * size
        for t in range(offsets[p], offsets[p + 1]):
            i = order[t]
            doc[t] = s_doc[i]
            src[t] = s_src[i]
            real[t] = s_real[i]
            pad[t] = s_pad[i]
            dst[t] = pos
            pos += s_real[i] + s_pad[i]
    return doc, src, real, pad, dst
