"""Context parallelism: each rank's share of a THD (flattened, `cu_seqlens`) batch.

The load-balanced split Transformer Engine (`thd_get_partitioned_indices`) and Megatron
(`get_batch_on_this_cp_rank` for packed sequences) use: every segment of the batch, padded to a
multiple of `2C` (`packtool pack --pad-multiple 2C`; the tail padding is a segment too, so the pack
size must be a multiple of `2C` as well), is cut into `2C` equal chunks and rank `r` keeps chunks
`r` and `2C-1-r`, segment after segment. Under causal attention chunk `c` of a segment with chunks of
`m` tokens attends to `c*m*m + m*(m+1)/2` query-key pairs, so the pair of chunks `r` and `2C-1-r`
costs `(2C-1)*m*m + m*(m+1)` on every rank: the work is exactly balanced, segment by segment.

A rank's local row is `[1, T/C]`; its segment `s` occupies `cu_seqlens_padded[s]/C ..
cu_seqlens_padded[s+1]/C` locally (first chunk `r`, then chunk `2C-1-r`); `cu_seqlens*` stay global
and unsharded, as those kernels expect. Labels are unshifted (Hugging Face convention), and a rank
cannot shift them itself (the next token may live on another rank), so the batch also carries
`shift_labels`: the labels shifted by one in the UNSHARDED sequence (-100 where the next token
starts another segment or does not exist), sharded the same way, i.e. `logits[t]` is scored against
`shift_labels[t]` with no further shift (what transformers' loss takes as `shift_labels`).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from packtool.errors import ConfigError
from packtool.loader.buffers import BufferPool
from packtool.loader.kernels import IGNORE_INDEX


def check_cp(cp_size: int, cp_rank: int) -> None:
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ConfigError(
            f"cp_rank {cp_rank} is not in 0..{cp_size - 1} (cp_size {cp_size}), PackedCollator, pass cp_size >= 1 and 0 <= cp_rank < cp_size"
        )


def check_layout(lens: np.ndarray, cp_size: int, row_length: int | None = None) -> None:
    """Refuse a batch whose pack size or segments are not multiples of `2 * cp_size`, naming the fix."""
    m = 2 * cp_size
    if row_length is not None and row_length % m:
        raise ConfigError(
            f"pack size {row_length} is not a multiple of 2*cp_size={m} (its tail padding cannot be split), PackedCollator(cp_size={cp_size}), re-pack with `packtool pack --size` a multiple of {m} and `--pad-multiple {m}`"
        )
    bad = np.flatnonzero(np.asarray(lens) % m)
    if bad.size:
        k = int(bad[0])
        raise ConfigError(
            f"segment {k} of the batch has {int(lens[k])} tokens, not a multiple of 2*cp_size={m} ({bad.size} such segments), PackedCollator(cp_size={cp_size}), re-pack with `packtool pack --pad-multiple {m}` (and a --size that is a multiple of {m})"
        )


def partition_indices(cu_seqlens_padded: np.ndarray, cp_size: int, cp_rank: int) -> np.ndarray:
    """int64 positions (in the unsharded flattened batch) of rank `cp_rank`'s tokens, in local order.

    Segment after segment: chunk `cp_rank`, then chunk `2*cp_size-1-cp_rank`, each `len/(2*cp_size)`
    tokens. Vectorised: one `np.repeat` over the 2 runs per segment, no per-token Python.
    """
    cu = np.asarray(cu_seqlens_padded, dtype=np.int64)
    lens = np.diff(cu)
    check_layout(lens, cp_size)
    m = lens // (2 * cp_size)  # chunk length of each segment
    starts = np.stack([cu[:-1] + cp_rank * m, cu[:-1] + (2 * cp_size - 1 - cp_rank) * m], axis=1).reshape(-1)
    runs = np.repeat(m, 2)
    first = np.cumsum(runs) - runs  # where each run begins in the local row
    return np.repeat(starts - first, runs) + np.arange(int(runs.sum()), dtype=np.int64)


@njit(cache=True, nogil=True)
def gather_rank(
    ids: np.ndarray, labels: np.ndarray, pos: np.ndarray, cu: np.ndarray, cp_size: int, cp_rank: int, out: np.ndarray
) -> None:
    """`partition_indices` and the gather in one compiled pass: rows of `out` `[4, T/C]` receive the
    rank's input_ids, labels, position_ids and shift_labels (segments already checked by `check_layout`)."""
    two = 2 * cp_size
    k = 0
    for s in range(cu.size - 1):
        a = cu[s]
        end = cu[s + 1]
        m = (end - a) // two
        for half in range(2):
            base = a + (cp_rank if half == 0 else two - 1 - cp_rank) * m
            for j in range(m):  # straight copies: LLVM vectorises these loops
                out[0, k + j] = ids[base + j]
                out[1, k + j] = labels[base + j]
                out[2, k + j] = pos[base + j]
            inside = m if base + m < end else m - 1  # the segment's last token predicts nothing
            for j in range(inside):
                out[3, k + j] = labels[base + j + 1]
            if inside < m:
                out[3, k + m - 1] = IGNORE_INDEX
            k += m


def shard(
    ids: torch.Tensor,
    labels: torch.Tensor,
    pos: torch.Tensor,
    cu: np.ndarray,
    cp_size: int,
    cp_rank: int,
    pool: BufferPool | None = None,
) -> dict[str, torch.Tensor]:
    """Rank `cp_rank`'s `[1, T/C]` input_ids, labels, position_ids (of the unsharded sequence) and
    shift_labels, plus `cu_seqlens_local` (the global padded offsets divided by C: where each segment's
    two chunks sit in the local row), from a batch and its global padded `cu`. One compiled pass
    (`gather_rank`) writes the four rows into ONE buffer (one storage to send from a DataLoader worker)."""
    cu64 = np.asarray(cu, np.int64)
    check_layout(np.diff(cu64), cp_size)
    local = int(cu64[-1]) // cp_size
    buffer = pool.get(4 * local) if pool is not None else np.empty(4 * local, np.int64)  # a fresh one page-faults
    out = buffer[: 4 * local].reshape(4, 1, local)
    flat = [t.reshape(-1).numpy() for t in (ids, labels, pos)]
    gather_rank(flat[0], flat[1], flat[2], cu64, cp_size, cp_rank, out[:, 0])
    rows = torch.from_numpy(out)
    return {
        "input_ids": rows[0],
        "labels": rows[1],
        "position_ids": rows[2],
        "shift_labels": rows[3],
        "cu_seqlens_local": torch.from_numpy((cu64 // cp_size).astype(np.int32)),
    }
