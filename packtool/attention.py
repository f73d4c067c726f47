"""`varlen_attention`: attention restricted to the segments of a packed sequence.

On CUDA with fp16/bf16 and flash-attn installed this is `flash_attn_varlen_func` (imported
lazily: importing packtool never needs CUDA). Everywhere else it is an EXACT fallback built
on `torch.nn.functional.scaled_dot_product_attention`: segments of equal length are
gathered into one `[S, heads, L, head_dim]` batch (a Zipf-shaped pack of 4096 tokens has
a few dozen distinct lengths, so a few dozen SDPA calls instead of one per document),
and each call sees only its own segment, so no token attends across a document boundary.
Chunks keep the `S * heads * L * L` score matrix of the math backend below ~64M elements.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packtool.errors import ConfigError

_SCORE_BUDGET = 1 << 26  # elements of the attention matrix per SDPA call in the fallback


@cache
def _flash() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # not installed, or built against another torch/CUDA: use the fallback
        return None
    return flash_attn_varlen_func


def flash_available(q: torch.Tensor) -> bool:
    """True when `varlen_attention(q, ...)` would run flash-attn's kernel."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _flash() is not None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of `(total_tokens, heads, head_dim)` q/k/v within each `cu_seqlens` segment.

    k and v may have fewer heads than q (GQA/MQA) as long as they divide q's heads.
    Zero-length segments (static `cu_seqlens` padding) are allowed. `backend` is `auto`,
    `flash` (fail if unavailable) or `torch` (always the exact fallback).
    """
    if (
        q.ndim != 3
        or k.ndim != 3
        or v.ndim != 3
        or k.shape != v.shape
        or q.shape[0] != k.shape[0]
        or q.shape[2] != k.shape[2]
    ):
        raise ConfigError(
            f"q, k, v must be (total_tokens, heads, head_dim) with matching tokens and head_dim, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, varlen_attention, reshape [B, N, H, D] to [B*N, H, D]"
        )
    if q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"query heads ({q.shape[1]}) are not a multiple of key/value heads ({k.shape[1]}), varlen_attention, use a GQA layout with kv heads dividing q heads"
        )
    if backend not in ("auto", "flash", "torch"):
        raise ConfigError(f"unknown backend {backend!r}, varlen_attention, use auto, flash or torch")
    use_flash = backend == "flash" or (backend == "auto" and flash_available(q))
    if use_flash:
        if not flash_available(q):
            raise ConfigError(
                "flash-attn is not usable here (needs it installed, CUDA tensors and fp16/bf16), varlen_attention, use backend='auto'"
            )
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        return _flash()(
            q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), dropout_p=0.0, softmax_scale=softmax_scale, causal=causal
        )
    return _sdpa_segments(q, k, v, cu_seqlens, int(max_seqlen), causal, softmax_scale)


def _segments(cu_seqlens: torch.Tensor, total: int, max_seqlen: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the segments, checked by the collator's own validation (kernels fail silently)."""
    from packtool.loader.collator import validate_cu_seqlens

    cu = cu_seqlens.detach().reshape(-1)
    validate_cu_seqlens(cu if cu.dtype == torch.int32 else cu.to(torch.int32), total, max_seqlen)
    cu64 = cu.cpu().numpy().astype(np.int64)
    return cu64[:-1], np.diff(cu64)


def _sdpa_segments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
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
