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

from packtool.errors import ConfigError
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


def shifted_labels(labels: torch.Tensor, cu_seqlens: np.ndarray) -> torch.Tensor:
    """`[T]` targets of each position: `labels[t+1]` inside a segment, -100 before a segment start
    and at the end. With packtool's labels (-100 at every segment's first token) this is just the
    row shifted by one; the explicit mask keeps it right for any labels."""
    flat = labels.reshape(-1)
    out = torch.full_like(flat, IGNORE_INDEX)
    out[:-1] = flat[1:]
    bounds = np.asarray(cu_seqlens, dtype=np.int64)
    cut = bounds[(bounds > 0) & (bounds < flat.numel())]
    if cut.size:
        out[torch.from_numpy(cut - 1)] = IGNORE_INDEX
    return out


def shard(
    ids: torch.Tensor, labels: torch.Tensor, pos: torch.Tensor, cu: np.ndarray, cp_size: int, cp_rank: int
) -> dict[str, torch.Tensor]:
    """Rank `cp_rank`'s `[1, T/C]` input_ids, labels, position_ids (of the unsharded sequence) and
    shift_labels, plus `cu_seqlens_local` (the global padded offsets divided by C: where each segment's
    two chunks sit in the local row), from a batch and its global padded `cu`."""
    idx = torch.from_numpy(partition_indices(cu, cp_size, cp_rank))
    shift = shifted_labels(labels, cu)
    out = {
        "input_ids": ids.reshape(-1).index_select(0, idx)[None],
        "labels": labels.reshape(-1).index_select(0, idx)[None],
        "position_ids": pos.reshape(-1).index_select(0, idx)[None],
        "shift_labels": shift.index_select(0, idx)[None],
        "cu_seqlens_local": torch.from_numpy((np.asarray(cu, np.int64) // cp_size).astype(np.int32)),
    }
    return out
