"""The exact varlen attention: SDPA per group of equal-length segments (CPU, any dtype, any GPU).

Segments of equal length are gathered into one `[S, heads, L, head_dim]` batch (a Zipf-shaped pack
of 4096 tokens has a few dozen distinct lengths, so a few dozen SDPA calls instead of one per
document), and each call sees only its own segment, so no token attends across a document
boundary. Chunks keep the `S * heads * L * L` score matrix of the math backend below ~64M elements.
It is the reference every kernel backend is tested against (tests/test_gpu.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

_SCORE_BUDGET = 1 << 26  # elements of the attention matrix per SDPA call


def _segments(cu_seqlens: torch.Tensor, total: int, max_seqlen: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the segments, checked by the collator's own validation (kernels fail silently)."""
    from packtool.loader.collator import validate_cu_seqlens

    cu = cu_seqlens.detach().reshape(-1)
    validate_cu_seqlens(cu if cu.dtype == torch.int32 else cu.to(torch.int32), total, max_seqlen)
    cu64 = cu.cpu().numpy().astype(np.int64)
    return cu64[:-1], np.diff(cu64)


def sdpa_segments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """Exact attention of `(total_tokens, heads, head_dim)` q/k/v within each segment (GQA by repetition)."""
    total, heads, dim = q.shape
    starts, lens = _segments(cu_seqlens, total, max_seqlen)
    if k.shape[1] != heads:  # GQA: each kv head serves heads/kv_heads consecutive q heads
        rep = heads // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    order_idx: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for length in np.unique(lens[lens > 0]).tolist():  # per distinct length, never per token
        seg_starts = starts[lens == length]
        per_call = max(1, _SCORE_BUDGET // (heads * length * length))
        for c in range(0, seg_starts.size, per_call):
            chunk = seg_starts[c : c + per_call]
            idx = torch.from_numpy((chunk[:, None] + np.arange(length)).reshape(-1)).to(q.device)
            s = chunk.size

            def gather(t: torch.Tensor, idx: torch.Tensor = idx, s: int = s, length: int = length) -> torch.Tensor:
                return t.index_select(0, idx).view(s, length, heads, dim).transpose(1, 2)

            o = F.scaled_dot_product_attention(gather(q), gather(k), gather(v), is_causal=causal, scale=scale)
            outputs.append(o.transpose(1, 2).reshape(s * length, heads, dim))
            order_idx.append(idx)
    if not outputs:
        return torch.zeros_like(q)
    return torch.zeros_like(q).index_copy(0, torch.cat(order_idx), torch.cat(outputs))
