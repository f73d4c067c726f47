"""Pack-row blocks: the stage's unit of parallel work, a pure task with a GIL-free copy kernel.

Rows are cut into fixed blocks (`BLOCK_TOKENS` positions, whatever the worker count); each
`PackBlockTask` copies its segments from the memory-mapped `tokens.bin` straight into the `.npy`
temp file (opened `r+`; the coordinator wrote the header) and fills the gaps with the pad id.
Blocks are disjoint, so they run in any order on any executor and the bytes never change.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
from numba import njit

from packtool.formats.pack_writer import PackSplitWriter
from packtool.formats.store_set import StoreSet
from packtool.formats.token_store import MANIFEST, TokenStore, open_token_store
from packtool.signals import signals_deferred
from packtool.stages.pack.layout import Layout

#: positions per block of rows (a unit of parallel work; fixed, so blocks never depend on workers)
BLOCK_TOKENS = 1 << 22


@njit(nogil=True, cache=True)
def gather_segments(
    source: np.ndarray, src: np.ndarray, real: np.ndarray, dst: np.ndarray, out: np.ndarray, fill: int
) -> None:
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


@njit(nogil=True, cache=True)
def gather_mixture(
    sources: tuple[np.ndarray, ...],
    has: np.ndarray,
    which: np.ndarray,
    src: np.ndarray,
    real: np.ndarray,
    dst: np.ndarray,
    out: np.ndarray,
    fill: int,
) -> None:
    """`gather_segments` over several stores: segment j copies from `sources[which[j]]` (local `src[j]`),
    or is all 1s where `has[which[j]]` is False (a loss matrix over a store without tokens.loss).

    Still one pass over `out`; compiled once per number of stores (a homogeneous tuple).
    """
    cursor = 0
    for j in range(src.size):
        d, s, n, k = dst[j], src[j], real[j], which[j]
        out[cursor:d] = fill
        if has[k]:
            out[d : d + n] = sources[k][s : s + n]
        else:
            out[d : d + n] = 1
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
    more_dirs: tuple[str, ...] = ()  # a mixture's other stores; `src` is then global (store_set.StoreSet)
    token_offsets: tuple[int, ...] = ()  # global first token of each store, with the total last

    def run(self) -> tuple[int, int]:
        if self.more_dirs:
            return self._run_mixture()
        store = _open_source(self.tokens_dir)
        _write_rows(self.out_tokens, self.p0, self.p1, store.tokens, self, self.pad_id)
        if self.out_loss is not None and store.loss is not None:
            _write_rows(self.out_loss, self.p0, self.p1, store.loss, self, 0)
        return self.p0, self.p1

    def _run_mixture(self) -> tuple[int, int]:
        """Each segment from its own store's tokens.bin (loss: 1s for a store without tokens.loss)."""
        stores = [_open_source(d) for d in (self.tokens_dir, *self.more_dirs)]
        offsets = np.asarray(self.token_offsets, np.int64)
        which = np.searchsorted(offsets, self.src, side="right") - 1
        local = self.src - offsets[which]
        outputs = [(self.out_tokens, [s.tokens for s in stores], self.pad_id)]
        if self.out_loss is not None:
            none = np.zeros(0, np.uint8)
            outputs.append((self.out_loss, [none if s.loss is None else s.loss for s in stores], 0))
        for path, sources, fill in outputs:
            has = np.array([a.size > 0 or st.n_tokens == 0 for a, st in zip(sources, stores, strict=True)])
            matrix = np.lib.format.open_memmap(path, mode="r+")
            try:
                rows = matrix[self.p0 : self.p1].reshape(-1)
                with signals_deferred():
                    gather_mixture(tuple(map(_readonly, sources)), has, which, local, self.real, self.dst, rows, fill)
                if self.sync:
                    matrix.flush()
            finally:
                del matrix
        return self.p0, self.p1


def _readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only plain-ndarray view: numba indexes a tuple of arrays only when all have one type."""
    view = arr.view(np.ndarray)
    view.flags.writeable = False
    return view


def _write_rows(path: str, p0: int, p1: int, source: np.ndarray, task: PackBlockTask, fill: int) -> None:
    matrix = np.lib.format.open_memmap(path, mode="r+")
    try:
        rows = matrix[p0:p1].reshape(-1)  # a view: the kernel writes straight into the mapped file
        with signals_deferred():  # a block is milliseconds: Ctrl-C/SIGTERM land right after it
            gather_segments(source, task.src, task.real, task.dst, rows, fill)
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
            if len(_SOURCES) >= 32:
                _SOURCES.clear()
            store = _SOURCES[key] = open_token_store(tokens_dir)
        return store


def block_tasks(
    layout: Layout,
    stores: StoreSet | TokenStore,
    writer: PackSplitWriter,
    size: int,
    pad_id: int,
    sync: bool = False,
    block_tokens: int | None = None,
) -> list[PackBlockTask]:
    """Cut the packs into fixed blocks of rows (independent of workers): one task each."""
    rows = max(1, (block_tokens or BLOCK_TOKENS) // size)
    out_tokens = str(writer.tokens.filename)  # type: ignore[union-attr]  # a np.memmap when n_packs > 0
    out_loss = str(writer.loss.filename) if writer.loss is not None else None  # type: ignore[attr-defined]
    stores = StoreSet.of(stores)
    more = tuple(str(s.path) for s in stores.stores[1:])
    offsets = tuple(int(o) for o in stores.token_offsets) if more else ()
    tasks = []
    for p0 in range(0, layout.n_packs, rows):
        p1 = min(layout.n_packs, p0 + rows)
        s0, s1 = int(layout.pack_offsets[p0]), int(layout.pack_offsets[p1])
        tasks.append(
            PackBlockTask(
                str(stores.first.path),
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
                more,
                offsets,
            )
        )
    return tasks
