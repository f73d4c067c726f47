"""FlexAttention over packed sequences: a document-causal `BlockMask` from `cu_seqlens`, no T×T mask.

torch's `create_block_mask` evaluates the mask_mod on every (query, key) pair, a dense T×T bool
(1 GiB at T=32k) unless it is compiled. A packed batch needs no such scan: its documents are
contiguous runs, so whether a 128×128 tile is empty, partial or full follows from the document
ids of the tile's first and last token, O((T/128)²) booleans (64 KiB at T=32k). The kernel then
runs the mask_mod, a lookup in a per-token document-id vector, only on partial tiles (those a
document boundary or the causal diagonal cuts). The tiles equal `create_block_mask`'s exactly
(tests/test_flex.py).

`DocumentMaskCache` keeps ONE BlockMask per shape and refreshes it in place, tiles and document
ids together: a compiled model sees the same mask object and mask_mod every step. A mask it
returned earlier for that shape then describes the newest batch; build the next batch's mask
after the current backward (the usual loop), or use `document_block_mask` (a fresh mask per call)
when several batches are in flight at once (pipeline schedules).

`flex_varlen_attention` runs `flex_attention` on `(total_tokens, heads, head_dim)` tensors:
compiled on CUDA, eager elsewhere (CPU has no backward; float32 is its domain, float64 fails).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from packtool.errors import ConfigError

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

BLOCK_SIZE = 128
"""flex_attention's tile (its default `_DEFAULT_SPARSE_BLOCK_SIZE`)."""

_MASK_TENSORS = (
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
)


def document_ids(cu_seqlens: torch.Tensor, total_len: int | None = None) -> torch.Tensor:
    """int32 `[total_len]`: the index of each token's segment in `cu_seqlens` (checked like the collator's)."""
    from packtool.loader.collator import validate_cu_seqlens

    cu = cu_seqlens.detach().reshape(-1).cpu()
    total = int(cu[-1]) if total_len is None else int(total_len)
    validate_cu_seqlens(cu.to(torch.int32), total, total)
    lens = torch.diff(cu.to(torch.int64))
    return torch.repeat_interleave(torch.arange(lens.numel(), dtype=torch.int32), lens)


def _tiles(doc: np.ndarray, block: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(partial, full) bool `[n_blocks, n_blocks]`: tiles the mask cuts, and tiles it keeps whole."""
    total = doc.size
    nb = -(-total // block)
    first = doc[np.arange(nb) * block]
    last = doc[np.minimum(np.arange(1, nb + 1) * block, total) - 1]
    qi, kj = np.arange(nb)[:, None], np.arange(nb)[None, :]
    if causal:  # documents never decrease along the row: a tile shares one iff kv's last doc is q's first
        live = (kj == qi) | ((kj < qi) & (last[None, :] == first[:, None]))
        full = (kj < qi) & (first[None, :] == last[:, None])
    else:
        live = (first[:, None] <= last[None, :]) & (first[None, :] <= last[:, None])
        one = first == last
        full = one[:, None] & one[None, :] & (first[:, None] == first[None, :])
    if total % block:  # a short last tile is never full (torch pads it with masked positions)
        full[-1, :] = False
        full[:, -1] = False
    return live & ~full, full


def _ordered(dense: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's (num_blocks, indices) of a tile matrix: each row's live columns first, ascending, then the rest.

    The order torch's stable argsort gives, computed by counting instead of sorting.
    """
    rows, cols = dense.shape
    live = np.cumsum(dense, axis=1, dtype=np.int32)
    count = live[:, -1].copy() if cols else np.zeros(rows, dtype=np.int32)
    dead = np.arange(1, cols + 1, dtype=np.int32)[None, :] - live
    slot = np.where(dense, live - 1, count[:, None] + dead - 1)
    indices = np.empty_like(slot)
    np.put_along_axis(indices, slot, np.broadcast_to(np.arange(cols, dtype=np.int32), slot.shape), axis=1)
    return (
        torch.from_numpy(count)[None, None].to(device),
        torch.from_numpy(indices)[None, None].to(device),
    )


def _mask_mod(doc: torch.Tensor, causal: bool) -> Callable[..., torch.Tensor]:
    def document_causal(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def document(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return doc[q_idx] == doc[kv_idx]

    return document_causal if causal else document


def _doc_buffer(total: int, block: int, device: torch.device) -> torch.Tensor:
    """Document ids padded to whole tiles with -1 (a kernel may look up positions past the end)."""
    return torch.full((-(-total // block) * block,), -1, dtype=torch.int32, device=device)


def _build(
    cu_seqlens: torch.Tensor, total_len: int | None, causal: bool, block: int, device: torch.device | None
) -> tuple[torch.Tensor, int, Any]:
    """(document ids, T, function making the BlockMask for a given doc buffer + mask_mod)."""
    from torch.nn.attention.flex_attention import BlockMask

    if block < 1:
        raise ConfigError(f"block_size must be >= 1, got {block}, document_block_mask, use the default 128")
    doc = document_ids(cu_seqlens, total_len)
    total = int(doc.numel())
    if total == 0:
        raise ConfigError("cu_seqlens describes 0 tokens, document_block_mask, pass a batch with tokens")
    dev = torch.device(device) if device is not None else cu_seqlens.device
    partial, full = _tiles(doc.numpy(), block, causal)
    kv_num, kv_idx = _ordered(partial, dev)
    full_num, full_idx = _ordered(full, dev)
    q_num, q_idx = _ordered(np.ascontiguousarray(partial.T), dev)  # the backward pass walks columns
    full_q_num, full_q_idx = _ordered(np.ascontiguousarray(full.T), dev)

    def make(mask_mod: Callable[..., torch.Tensor]) -> BlockMask:
        return BlockMask(
            seq_lengths=(total, total),
            kv_num_blocks=kv_num,
            kv_indices=kv_idx,
            full_kv_num_blocks=full_num,
            full_kv_indices=full_idx,
            q_num_blocks=q_num,
            q_indices=q_idx,
            full_q_num_blocks=full_q_num,
            full_q_indices=full_q_idx,
            BLOCK_SIZE=(block, block),
            mask_mod=mask_mod,
        )

    return doc.to(dev), total, make


def document_block_mask(
    cu_seqlens: torch.Tensor,
    total_len: int | None = None,
    *,
    causal: bool = True,
    block_size: int = BLOCK_SIZE,
    device: torch.device | str | None = None,
) -> BlockMask:
    """A fresh `BlockMask` keeping attention inside each `cu_seqlens` segment (causal by default).

    `total_len` defaults to `cu_seqlens[-1]`; the mask lives on `device` (default: cu_seqlens').
    Its shape is `(1, 1, T, T)`: it broadcasts over heads, for a flattened `[1, T]` batch.
    """
    dev = torch.device(device) if device is not None else None
    doc, total, make = _build(cu_seqlens, total_len, causal, block_size, dev)
    buf = _doc_buffer(total, block_size, doc.device)
    buf[:total] = doc
    return make(_mask_mod(buf, causal))  # type: ignore[no-any-return]


class DocumentMaskCache:
    """One reusable document BlockMask per (T, device): same object and mask_mod every batch of that shape.

    `cache(cu_seqlens, total_len)` rebuilds the tiles and copies them, with the document ids,
    into the shape's mask IN PLACE, so the mask always describes the latest call. See the module
    docstring for when that is not what you want.
    """

    def __init__(self, *, causal: bool = True, block_size: int = BLOCK_SIZE, max_shapes: int = 8) -> None:
        self.causal = causal
        self.block_size = block_size
        self.max_shapes = max_shapes
        self._slots: dict[tuple[int, str], tuple[torch.Tensor, Callable[..., torch.Tensor], BlockMask]] = {}

    def __call__(
        self, cu_seqlens: torch.Tensor, total_len: int | None = None, device: torch.device | str | None = None
    ) -> BlockMask:
        dev = torch.device(device) if device is not None else None
        doc, total, make = _build(cu_seqlens, total_len, self.causal, self.block_size, dev)
        key = (total, str(doc.device))
        fresh = None
        if key not in self._slots:
            if len(self._slots) >= self.max_shapes:
                self._slots.pop(next(iter(self._slots)))
            buf = _doc_buffer(total, self.block_size, doc.device)
            mask_mod = _mask_mod(buf, self.causal)
            fresh = make(mask_mod)
            self._slots[key] = (buf, mask_mod, fresh)
        buf, mask_mod, mask = self._slots[key]
        buf[:total].copy_(doc)
        if fresh is None:  # refresh the tiles of the existing mask (same shapes: same T and tile size)
            new = make(mask_mod)
            for name in _MASK_TENSORS:
                old, now = getattr(mask, name, None), getattr(new, name, None)
                if isinstance(old, torch.Tensor) and isinstance(now, torch.Tensor) and old.shape == now.shape:
                    old.copy_(now)
                else:
                    setattr(mask, name, now)
        return mask


@cache
def _compiled_flex() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)  # type: ignore[no-any-return]


def flex_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    block_mask: BlockMask | None = None,
    compiled: bool | None = None,
) -> torch.Tensor:
    """`flex_attention` of `(total_tokens, heads, head_dim)` q/k/v inside each segment, like `varlen_attention`.

    Pass `block_mask` (from `document_block_mask` or a `DocumentMaskCache`) to reuse one across
    layers; otherwise it is built from `cu_seqlens`. `compiled` defaults to True on CUDA (the
    eager path materialises every score) and False elsewhere.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"q, k, v must be (total_tokens, heads, head_dim) with kv heads dividing q heads, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, flex_varlen_attention, reshape [B, N, H, D] to [B*N, H, D]"
        )
    total = q.shape[0]
    if block_mask is None:
        if cu_seqlens is None:
            raise ConfigError("pass cu_seqlens or block_mask, flex_varlen_attention, e.g. the batch's cu_seqlens")
        block_mask = document_block_mask(cu_seqlens, total, causal=causal, device=q.device)
    if tuple(block_mask.seq_lengths) != (total, total):
        raise ConfigError(
            f"block_mask is for {tuple(block_mask.seq_lengths)} tokens, q has {total}, flex_varlen_attention, build the mask from this batch's cu_seqlens"
        )
    use_compiled = q.is_cuda if compiled is None else compiled
    fn = _compiled_flex() if use_compiled else cast("Callable[..., Any]", flex_attention)
    args = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]  # [1, heads, T, head_dim]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        out = fn(*args, block_mask=block_mask, scale=softmax_scale, enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)  # type: ignore[no-any-return]
