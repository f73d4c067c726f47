"""The pack-store writer: token store -> segments -> packs -> `{split}_{N}.npy` + companions.

Only index arrays (a few int64 per segment) live in memory; tokens never pass through Python.
After `pack_lengths`, the rows are cut into fixed blocks (`_BLOCK_TOKENS` positions, whatever
the worker count) and each block is a pure `PackBlockTask`: a compiled, GIL-free kernel copies
its segments from the memory-mapped `tokens.bin` straight into the `.npy` temp file (opened
`r+`; the coordinator wrote the header) and fills the gaps with the pad id. Blocks are disjoint,
so they run in any order on any executor (`--executor local`: a thread pool; `ray`: Ray tasks on
a shared file system) and the bytes are identical for every `--workers`/executor. Same input +
seed -> byte-identical files. Measured (scripts/bench_pack_write.py, 2 cores, 1 GB of packs):
2 threads write at 1.38 GB/s, 2.5x a single-threaded memcpy of the same bytes and 10x the numpy
gather this replaced (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from packtool import __version__
from packtool.config import PackConfig
from packtool.errors import ConfigError
from packtool.formats.pack_store import PackSplitWriter, pack_dir
from packtool.formats.token_store import MANIFEST, TokenStore, dtype_name, open_token_store
from packtool.packing import lower_bound, pack_lengths
from packtool.packing.segments import Segments, build_segments

log = logging.getLogger(__name__)

#: positions per block of rows (a unit of parallel work; fixed, so blocks never depend on workers)
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


@njit(nogil=True, cache=True)
def _gather(source: np.ndarray, src: np.ndarray, real: np.ndarray, dst: np.ndarray, out: np.ndarray, fill: int) -> None:
    """Copy each segment's `real` tokens from `source[src:]` to `out[dst:]`, `fill` in every gap.

    One pass over `out` (each position written once), segments in pack order so `dst` ascends;
    compiled with nogil so that several threads copy blocks truly in parallel.
    """
    cursor = 0
    for j in range(src.size):
        d, s, n = dst[j], src[j], real[j]
        out[cursor:d] = fill
        out[d : d + n] = source[s : s + n]
        cursor = d + n
    out[cursor:] = fill


@dataclass(frozen=True)
class PackBlockTask:
    """Write rows [p0, p1) of the pack matrices: a pure, picklable unit of work.

    It reads the token store at `tokens_dir` (memory-mapped) and writes into the `.npy` temp files
    that the coordinator created (header included) at `out_tokens` / `out_loss`, opened `r+`.
    Blocks never overlap, so any number of them may run at once, in threads, processes or Ray.
    """

    tokens_dir: str
    p0: int
    p1: int
    size: int
    pad_id: int
    src: np.ndarray  # int64 segment starts in tokens.bin, pack order
    real: np.ndarray  # int64 real tokens per segment
    dst: np.ndarray  # int64 first position of each segment, relative to row p0
    out_tokens: str
    out_loss: str | None = None
    sync: bool = False  # flush the maps before returning (another node's page cache: Ray)

    def run(self) -> tuple[int, int]:
        store = _open_source(self.tokens_dir)
        _write_rows(self.out_tokens, self.p0, self.p1, store.tokens, self, self.pad_id)
        if self.out_loss is not None and store.loss is not None:
            _write_rows(self.out_loss, self.p0, self.p1, store.loss, self, 0)
        return self.p0, self.p1


def _write_rows(path: str, p0: int, p1: int, source: np.ndarray, task: PackBlockTask, fill: int) -> None:
    matrix = np.lib.format.open_memmap(path, mode="r+")
    try:
        rows = matrix[p0:p1].reshape(-1)  # a view: the kernel writes straight into the mapped file
        _gather(source, task.src, task.real, task.dst, rows, fill)
        if task.sync:
            matrix.flush()
    finally:
        del matrix


_SOURCES: dict[tuple[str, int, int], TokenStore] = {}
_SOURCES_LOCK = threading.Lock()


def _open_source(tokens_dir: str) -> TokenStore:
    """The token store, opened once per process and file version (a re-tokenized store reopens).

    Sizes are checked here; the coordinator checked the hashes before planning.
    """
    st = os.stat(os.path.join(tokens_dir, MANIFEST))
    key = (tokens_dir, st.st_ino, st.st_mtime_ns)
    with _SOURCES_LOCK:
        store = _SOURCES.get(key)
        if store is None:
            if len(_SOURCES) >= 4:
                _SOURCES.clear()
            store = _SOURCES[key] = open_token_store(tokens_dir)
        return store


def block_tasks(
    layout: Layout,
    store: TokenStore,
    writer: PackSplitWriter,
    size: int,
    pad_id: int,
    sync: bool = False,
    block_tokens: int | None = None,
) -> list[PackBlockTask]:
    """Cut the packs into fixed blocks of rows (independent of workers): one task each."""
    rows = max(1, (block_tokens or _BLOCK_TOKENS) // size)
    out_tokens = str(writer.tokens.filename)  # type: ignore[attr-defined]  # a np.memmap when n_packs > 0
    out_loss = str(writer.loss.filename) if writer.loss is not None else None  # type: ignore[attr-defined]
    tasks = []
    for p0 in range(0, layout.n_packs, rows):
        p1 = min(layout.n_packs, p0 + rows)
        s0, s1 = int(layout.pack_offsets[p0]), int(layout.pack_offsets[p1])
        tasks.append(
            PackBlockTask(
                str(store.path),
                p0,
                p1,
                size,
                pad_id,
                layout.src[s0:s1],
                layout.real[s0:s1],
                layout.dst[s0:s1] - p0 * size,
                out_tokens,
                out_loss,
                sync,
            )
        )
    return tasks


def _write_matrices(
    layout: Layout,
    store: TokenStore,
    writer: PackSplitWriter,
    config: PackConfig,
    pad_id: int,
    progress: Progress | None,
) -> None:
    """Fill `{S}_{N}.npy` (and `.loss.npy`) block by block through the chosen executor."""
    if layout.n_packs == 0:
        return
    from packtool.executors import make_pack_executor  # here: packtool.executors imports the tokenizer side

    workers = max(1, config.workers if config.workers else (os.cpu_count() or 1))
    execute = make_pack_executor(str(config.executor), workers, config.ray_address)
    tasks = block_tasks(layout, store, writer, config.size, pad_id, sync=str(config.executor) == "ray")
    done = 0
    for p0, p1 in execute(tasks):
        done += p1 - p0
        if progress is not None:
            progress(done, layout.n_packs)


def _metadata(config: PackConfig, store: TokenStore, segments: Segments, layout: Layout, pad_id: int) -> dict[str, Any]:
    """The metadata line: Megatron-Bridge's keys (same definitions) plus packtool's provenance."""
    size, n_packs = config.size, layout.n_packs
    lengths = layout.lengths
    per_pack_tokens = (
        np.add.reduceat(lengths, layout.pack_offsets[:-1]) if n_packs and lengths.size else np.zeros(n_packs, np.int64)
    )
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
    if config.workers is not None and config.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {config.workers}, leave it out to use all cores")
    if config.max_docs_per_pack is not None and config.max_docs_per_pack < 1:
        raise ConfigError(f"--max-docs-per-pack must be >= 1, got {config.max_docs_per_pack}, leave it out for no cap")
    store = open_token_store(config.tokens_dir, check_hashes=True)
    segments = build_segments(store.starts, store.lengths, config.size, config.overlong, config.pad_multiple)
    layout = plan_layout(segments, config)
    pad_id = pad_id_for(store)
    directory = pack_dir(config.output, store.tokenizer_name)
    log.info("packing %d segments of %s into %d packs of %d", len(segments), store.path, layout.n_packs, config.size)
    writer = PackSplitWriter(
        directory, str(config.split), config.size, store.dtype, layout.n_packs, store.loss is not None
    )
    try:
        _write_matrices(layout, store, writer, config, pad_id, progress)
        companions = {
            "pack_offsets": layout.pack_offsets,
            "seg_lens": layout.lengths,
            "seg_pad": layout.pad,
            "seg_doc": layout.doc,
            "seg_src": layout.src,
        }
        for what, values in companions.items():
            writer.write_companion(what, values)
        record = writer.commit(_metadata(config, store, segments, layout, pad_id))
    except BaseException:
        writer.abort()
        raise
    return PackResult(directory, record)
