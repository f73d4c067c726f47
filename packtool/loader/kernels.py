"""Compiled (numba) kernels of the loader: one fused pass from pack rows to a training batch.

`fill_batch` reads each pack's token row, loss row and CSR segment entries once and writes
`input_ids`, `labels` and `position_ids` (int64) into ONE `[3, B, N]` buffer plus the global
int32 `cu_seqlens`: ~10x fewer memory passes and Python calls than the equivalent numpy, so
a B=8, N=4096 batch costs tens of microseconds. It runs in two halves: `plan_batch` (per
segment: validation, lengths, global `cu_seqlens`) and `fill_row` (per token, one row), so
`fill_batch(..., parallel=True)` can hand the rows to numba's threads (`prange`) with the same bytes out.
What remains is memory traffic: 24 output bytes per 2-byte input token (three int64 arrays),
which is why the loader cannot approach a bare copy of the stored bytes (docs/BENCHMARKS.md).

A shared-prompt preference store (`pack --share-prompt`) passes `seg_pos0`: the first position of each
segment (the prompt's length for a completion segment, 0 elsewhere), so a completion's positions continue
its prompt's and its first token keeps its label (it is predicted by the prompt's last token).

`check_cu` is `validate_cu_seqlens`'s scan, compiled: a status code, the message stays in Python."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

IGNORE_INDEX = -100


@njit(cache=True, nogil=True)
def plan_batch(
    n: int,
    pack_offsets: np.ndarray,
    seg_lens: np.ndarray,
    seg_pad: np.ndarray,
    idx: np.ndarray,
    lens_out: np.ndarray,
    real_out: np.ndarray,
    counts: np.ndarray,
    cu: np.ndarray,
    cu_real: np.ndarray,
    which: np.ndarray,
) -> tuple[int, int, int]:
    """The per-segment half of a batch (no token is read): validate every pack's segments and fill
    the segment arrays, the global `cu_seqlens` and `which` (the store segment of each entry, -1 for
    a tail padding). Returns `(n_entries, -1, longest segment)`, or `(0, r, 0)` when pack `idx[r]`
    has segments that do not fit its row (corrupt store)."""
    k = 0
    cu[0] = 0
    cu_real[0] = 0
    base = 0
    longest = 0
    for r in range(idx.size):
        i = idx[r]
        col = 0
        first = k
        for s in range(pack_offsets[i], pack_offsets[i + 1]):
            ln = int(seg_lens[s])
            pad = int(seg_pad[s])
            if ln < 0 or pad < 0 or pad > ln or col + ln > n:
                return 0, r, 0
            lens_out[k] = ln
            real_out[k] = ln - pad
            which[k] = s
            if ln > longest:
                longest = ln
            cu[k + 1] = base + col + ln
            cu_real[k + 1] = cu_real[k] + ln - pad
            k += 1
            col += ln
        if col < n:  # the tail padding is its own segment
            tail = n - col
            lens_out[k] = tail
            real_out[k] = tail
            which[k] = -1
            if tail > longest:
                longest = tail
            cu[k + 1] = base + n
            cu_real[k + 1] = cu_real[k] + tail
            k += 1
        counts[r] = k - first
        base += n
    return k, -1, longest


@njit(cache=True, nogil=True)
def fill_row(
    tokens: np.ndarray,
    loss: np.ndarray,
    has_loss: bool,
    pack_offsets: np.ndarray,
    seg_lens: np.ndarray,
    seg_pad: np.ndarray,
    seg_pos0: np.ndarray,
    has_pos0: bool,
    i: int,
    rows: np.ndarray,
    r: int,
) -> int:
    """The per-token half for pack `i` into batch row `r` (its segments already validated by
    `plan_batch`): write its ids, labels and positions (int64); returns its target-token count.
    `has_pos0`: positions of segment s start at `seg_pos0[s]`, and a segment that continues a prompt
    (`seg_pos0[s] > 0`) keeps its first label."""
    n = tokens.shape[1]
    tok = tokens[i]
    ids = rows[0, r]
    lab = rows[1, r]
    pos = rows[2, r]
    col = 0
    tgt = 0
    for s in range(pack_offsets[i], pack_offsets[i + 1]):
        ln = int(seg_lens[s])
        pad = int(seg_pad[s])
        if ln < 0 or pad < 0 or pad > ln or col + ln > n:
            return 0  # never taken (`plan_batch` checked), but it proves every index below is in 0..n,
            # which lets LLVM drop numba's negative-index wraparound and vectorise the loops (2x faster)
        real = ln - pad
        p0 = np.int64(seg_pos0[s]) if has_pos0 else np.int64(0)
        if has_loss:  # one widening pass writes all three rows (LLVM vectorises it)
            lrow = loss[i]
            for j in range(ln):
                t = np.int64(tok[col + j])
                keep = lrow[col + j] != 0
                ids[col + j] = t
                lab[col + j] = t if keep else IGNORE_INDEX
                pos[col + j] = p0 + j
                tgt += keep
        else:
            for j in range(ln):
                t = np.int64(tok[col + j])
                ids[col + j] = t
                lab[col + j] = t
                pos[col + j] = p0 + j
            tgt += ln
        for c in range(col + real, col + ln):  # --pad-multiple padding
            tgt -= lab[c] != IGNORE_INDEX
            lab[c] = IGNORE_INDEX
        if real > 0 and p0 == 0:  # a document's first token is never a target (a completion's may be)
            tgt -= lab[col] != IGNORE_INDEX
            lab[col] = IGNORE_INDEX
        col += ln
    for j in range(n - col):  # the tail padding
        ids[col + j] = tok[col + j]
        lab[col + j] = IGNORE_INDEX
        pos[col + j] = j
    return tgt


def fill_batch(
    tokens: np.ndarray,
    loss: np.ndarray,
    has_loss: bool,
    pack_offsets: np.ndarray,
    seg_lens: np.ndarray,
    seg_pad: np.ndarray,
    idx: np.ndarray,
    rows: np.ndarray,
    seg: np.ndarray,
    cus: np.ndarray,
    parallel: bool = False,
    seg_pos0: np.ndarray | None = None,
) -> tuple[int, int, int, int]:
    """Fill `rows` [3, B, N] (ids, labels, positions) and the segment arrays for packs `idx`.

    `seg` [5, cap] receives segment lengths, real lengths (without `--pad-multiple` padding),
    entries per pack, target tokens per pack and each entry's store segment (-1: tail padding; a
    `[4, cap]` seg leaves that out); `cus` [2, cap + 1] the global int32 `cu_seqlens`
    and its real-length twin; `cap` = the batch's segments plus one tail per pack. Returns
    `(n_entries, -1, longest segment, target tokens)`, or `(0, r, 0, 0)` when pack `idx[r]` has
    segments that do not fit its row (corrupt store; no row is written). With `parallel` the rows
    go to numba's threads (`prange`; same bytes out): only in the main process (see `dataset.py`).
    """
    which = seg[4] if seg.shape[0] > 4 else np.empty(seg.shape[1], np.int64)  # a [4, cap] `seg`: not kept
    k, bad, longest = plan_batch(
        tokens.shape[1], pack_offsets, seg_lens, seg_pad, idx, seg[0], seg[1], seg[2], cus[0], cus[1], which
    )
    if bad >= 0:
        return 0, bad, 0, 0
    fill = _fill_rows_parallel if parallel else _fill_rows
    has_pos0 = seg_pos0 is not None
    pos0 = seg_pos0 if seg_pos0 is not None else np.zeros(0, np.int64)
    fill(tokens, loss, has_loss, pack_offsets, seg_lens, seg_pad, pos0, has_pos0, idx, rows, seg[3])
    return k, -1, longest, int(seg[3, : idx.size].sum())


@njit(cache=True, nogil=True)
def _fill_rows(tokens, loss, has_loss, pack_offsets, seg_lens, seg_pad, pos0, has_pos0, idx, rows, n_target):  # type: ignore[no-untyped-def]
    for r in range(idx.size):
        n_target[r] = fill_row(tokens, loss, has_loss, pack_offsets, seg_lens, seg_pad, pos0, has_pos0, idx[r], rows, r)


@njit(cache=True, nogil=True, parallel=True)
def _fill_rows_parallel(tokens, loss, has_loss, pack_offsets, seg_lens, seg_pad, pos0, has_pos0, idx, rows, n_target):  # type: ignore[no-untyped-def]
    for r in prange(idx.size):  # rows are independent once plan_batch has laid out the segments
        n_target[r] = fill_row(tokens, loss, has_loss, pack_offsets, seg_lens, seg_pad, pos0, has_pos0, idx[r], rows, r)


@njit(cache=True, nogil=True)
def segments_of(pack_offsets: np.ndarray, idx: np.ndarray) -> int:
    """How many segments the packs `idx` hold (sizes `fill_batch`'s outputs); -1: an index is out of range."""
    total = 0
    n_packs = pack_offsets.size - 1
    for i in idx:
        if i < 0 or i >= n_packs:
            return -1
        total += pack_offsets[i + 1] - pack_offsets[i]
    return total


@njit(cache=True, nogil=True)
def check_cu(cu: np.ndarray, total_tokens: int, max_seqlen: int) -> tuple[int, int]:
    """(0, 0) when valid; (1, 0) wrong ends; (2, at) decreases at `at`; (3, longest) too long."""
    if cu[0] != 0 or cu[cu.size - 1] != total_tokens:
        return 1, 0
    longest = 0
    for j in range(cu.size - 1):
        d = int(cu[j + 1]) - int(cu[j])
        if d < 0:
            return 2, j
        if d > longest:
            longest = d
    if longest > max_seqlen:
        return 3, longest
    return 0, 0
