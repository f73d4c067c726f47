"""The pack-store writer: token store -> segments -> packs -> `{split}_{N}.npy` + companions.

Only index arrays (a few int64 per segment) live in memory; tokens move block by block: for a
block of packs, one np.repeat/arange builds the flat source and destination indices and one
fancy-index gather copies every segment from the memory-mapped `tokens.bin` into the block,
which is then written into the `.npy` memmap. Memory is bounded by the block size
(`_BLOCK_TOKENS`), whatever the corpus size. Same input + seed -> byte-identical files.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool import __version__
from packtool.config import PackConfig
from packtool.errors import ConfigError
from packtool.formats.pack_store import PackSplitWriter, pack_dir
from packtool.formats.token_store import MANIFEST, TokenStore, dtype_name, open_token_store
from packtool.packing import lower_bound, pack_lengths
from packtool.packing.segments import Segments, build_segments, expand_runs

log = logging.getLogger(__name__)

#: tokens copied per block (bounded memory: ~ 2 int64 indices + 1 token + 1 loss byte per token)
_BLOCK_TOKENS = 1 << 22

Progress = Callable[[int, int], None]
"""`progress(done, total)`: packs written so far out of the total (the CLI drives tqdm with it)."""


@dataclass(frozen=True)
class PackResult:
    """What `pack_store` wrote: the directory and the metadata line (every number in it)."""

    directory: Path
    metadata: dict[str, Any]


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
        offsets, order = pack_lengths(segments.lengths, size, algorithm=str(config.algorithm), seed=config.seed,
                                      shuffle=config.shuffle, max_items_per_pack=config.max_docs_per_pack)
        offsets, order = np.asarray(offsets, np.int64), np.asarray(order, np.int64)
    doc, src, real, pad = (a[order] for a in (segments.doc, segments.src, segments.real, segments.pad))
    lengths = real + pad
    per_pack = np.diff(offsets)
    excl = np.cumsum(lengths) - lengths
    within = excl - np.repeat(np.append(excl, 0)[offsets[:-1]], per_pack)  # offset inside its pack
    dst = np.repeat(np.arange(per_pack.size, dtype=np.int64) * size, per_pack) + within
    return Layout(offsets, doc, src, real, pad, dst)


def _fill_block(layout: Layout, p0: int, p1: int, size: int, source: np.ndarray, out: np.ndarray, fill: int) -> None:
    """Copy every segment of packs [p0, p1) from `source` into `out` (flat, (p1-p0)*size), pad elsewhere."""
    s0, s1 = int(layout.pack_offsets[p0]), int(layout.pack_offsets[p1])
    out[...] = fill
    src_idx, dst_idx = expand_runs(layout.real[s0:s1], layout.src[s0:s1], layout.dst[s0:s1] - p0 * size)
    out[dst_idx] = source[src_idx]


def _write_matrices(layout: Layout, store: TokenStore, writer: PackSplitWriter, size: int, pad_id: int,
                    progress: Progress | None) -> None:
    """Fill `{S}_{N}.npy` (and `.loss.npy`) block by block through the writer's memmaps."""
    n_packs = layout.n_packs
    rows = max(1, _BLOCK_TOKENS // size)
    tokens = np.asarray(store.tokens)
    loss = None if store.loss is None else np.asarray(store.loss)
    tok_block = np.empty(rows * size, writer.tokens.dtype)
    loss_block = np.empty(rows * size, np.uint8) if loss is not None else None
    for p0 in range(0, n_packs, rows):
        p1 = min(n_packs, p0 + rows)
        n = (p1 - p0) * size
        _fill_block(layout, p0, p1, size, tokens, tok_block[:n], pad_id)
        writer.tokens[p0:p1] = tok_block[:n].reshape(p1 - p0, size)
        if loss is not None and loss_block is not None and writer.loss is not None:
            _fill_block(layout, p0, p1, size, loss, loss_block[:n], 0)
            writer.loss[p0:p1] = loss_block[:n].reshape(p1 - p0, size)
        if progress is not None:
            progress(p1, n_packs)


def _metadata(config: PackConfig, store: TokenStore, segments: Segments, layout: Layout, pad_id: int) -> dict[str, Any]:
    """The metadata line: Megatron-Bridge's keys (same definitions) plus packtool's provenance."""
    size, n_packs = config.size, layout.n_packs
    lengths = layout.lengths
    per_pack_tokens = np.add.reduceat(lengths, layout.pack_offsets[:-1]) if n_packs and lengths.size else np.zeros(n_packs, np.int64)
    per_pack_count = np.diff(layout.pack_offsets)
    n_tokens = int(layout.real.sum())
    tok = store.manifest.get("tokenizer", {})
    manifest_sha = hashlib.sha256((store.path / MANIFEST).read_bytes()).hexdigest()
    return {
        # Megatron-Bridge (packing_utils.create_packing_strategy): lengths include --pad-multiple padding
        "pack_size": size,
        "max_samples_per_bin": int(per_pack_count.max()) if n_packs else 0,
        "dataset_max_seqlen": int(lengths.max()) if lengths.size else 0,
        "min_packed_seqlen": int(per_pack_tokens.min()) if n_packs else 0,
        "packing_factor": round(len(segments) / n_packs, 2) if n_packs else 0.0,
        "packing_efficiency": round(float(lengths.sum()) / n_packs / size * 100, 2) if n_packs else 0.0,
        # packtool
        "split": str(config.split),
        "algorithm": str(config.algorithm),
        "seed": config.seed,
        "shuffle": config.shuffle,
        "tokenizer": {"name": tok.get("name"), "sha256": tok.get("sha256")},
        "source": {"path": str(store.path.resolve()), "manifest_sha256": manifest_sha},
        "dtype": dtype_name(store.dtype),
        "pad_id": pad_id,
        "pad_multiple": config.pad_multiple,
        "max_docs_per_pack": config.max_docs_per_pack,
        "n_documents": store.n_documents,
        "n_segments": len(segments),
        "n_packs": n_packs,
        "n_tokens": n_tokens,
        "n_pad_tokens": n_packs * size - n_tokens,
        "n_dropped_tokens": segments.n_dropped_tokens,
        "lower_bound_packs": lower_bound(lengths, size, config.max_docs_per_pack),
        "overlong": {"policy": str(config.overlong), "count": segments.n_overlong},
        "n_empty_documents": segments.n_empty,
        "packtool_version": __version__,
    }


def pack_store(config: PackConfig, progress: Progress | None = None) -> PackResult:
    """Pack a token store into `ROOT/packed/{tokenizer}/{split}_{N}.*`; metadata line written last.

    Refuses a token store whose manifest, sizes or sha256 do not check out (FormatError).
    """
    if config.max_docs_per_pack is not None and config.max_docs_per_pack < 1:
        raise ConfigError(f"--max-docs-per-pack must be >= 1, got {config.max_docs_per_pack}, leave it out for no cap")
    store = open_token_store(config.tokens_dir, check_hashes=True)
    segments = build_segments(store.starts, store.lengths, config.size, config.overlong, config.pad_multiple)
    layout = plan_layout(segments, config)
    pad_id = pad_id_for(store)
    directory = pack_dir(config.output, store.tokenizer_name)
    log.info("packing %d segments of %s into %d packs of %d", len(segments), store.path, layout.n_packs, config.size)
    writer = PackSplitWriter(directory, str(config.split), config.size, store.dtype, layout.n_packs, store.loss is not None)
    try:
        _write_matrices(layout, store, writer, config.size, pad_id, progress)
        companions = {"pack_offsets": layout.pack_offsets, "seg_lens": layout.lengths, "seg_pad": layout.pad,
                      "seg_doc": layout.doc, "seg_src": layout.src}
        for what, values in companions.items():
            writer.write_companion(what, values)
        record = writer.commit(_metadata(config, store, segments, layout, pad_id))
    except BaseException:
        writer.abort()
        raise
    return PackResult(directory, record)
