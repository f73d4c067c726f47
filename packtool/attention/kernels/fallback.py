"""The exact varlen attention: SDPA per group of equal-length segments (CPU, any dtype, any GPU).

Segments whose (query, key) lengths are equal are gathered into one `[S, heads, Lq, head_dim]`
batch (a Zipf-shaped pack of 4096 tokens has a few dozen distinct lengths, so a few dozen calls
instead of one per document), and each call sees only its own segment, so no token attends
across a document boundary. Chunks keep the `S * heads * Lq * Lk` score matrix below ~64M
elements. It does every feature a model may ask for, as eager attention defines it: a sliding
window (flash-attn's inclusive `(left, right)`), logit softcapping (`tanh(s / c) * c` before the
mask), attention sinks (one extra logit per head in the softmax, dropped after it), dropout on
the probabilities, and causal attention aligned to the bottom right when a segment has more keys
than queries (a KV cache). Plain causal or full attention goes through SDPA itself. It is the
reference every kernel is tested against (tests/test_gpu.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packtool.attention.kernels.spec import Call, KernelSpec
from packtool.errors import ConfigError

_SCORE_BUDGET = 1 << 26  # elements of the attention matrix per call


def _segments(cu: torch.Tensor, total: int, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the segments, checked by the collator's own validation (kernels fail silently)."""
    from packtool.loader.collator import validate_cu_seqlens

    flat = cu.detach().reshape(-1)
    validate_cu_seqlens(flat if flat.dtype == torch.int32 else flat.to(torch.int32), total, max_len)
    cu64 = flat.cpu().numpy().astype(np.int64)
    return cu64[:-1], np.diff(cu64)


def allowed(lq: int, lk: int, causal: bool, window: tuple[int, int], device: torch.device) -> torch.Tensor | None:
    """bool `[lq, lk]`, True where query i may see key j (None: every pair). Query i sits at key i + lk - lq."""
    left, right = window
    if not causal and left < 0 and right < 0:
        return None
    diag = torch.arange(lq, device=device)[:, None] + (lk - lq)
    j = torch.arange(lk, device=device)[None, :]
    keep = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if causal:
        keep &= j <= diag
    elif right >= 0:
        keep &= j <= diag + right
    if left >= 0:
        keep &= j >= diag - left
    return None if bool(keep.all()) else keep


def _block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: Call) -> torch.Tensor:
    """Attention of `[S, H, Lq, D]` q against `[S, H, Lk, D]` k/v, every segment of the block alike."""
    lq, lk = q.shape[-2], k.shape[-2]
    keep = allowed(lq, lk, call.causal, call.window, q.device)
    dead = None
    if keep is not None:
        dead = ~keep.any(-1)  # queries that see no key (more queries than keys): output 0, as flash-attn gives
        if bool(dead.any()):
            keep = keep | dead[:, None]
        else:
            dead = None
    if call.softcap is None and call.sinks is None:
        if keep is None or (call.causal and lq == lk and call.window == (-1, -1)):
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=keep is not None, dropout_p=call.dropout, scale=call.scale
            )
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=call.dropout, scale=call.scale)
    else:
        scale = call.scale if call.scale is not None else 1 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if call.softcap is not None:
            scores = torch.tanh(scores / call.softcap) * call.softcap
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        if call.sinks is not None:
            sink = call.sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        if call.dropout > 0:
            probs = F.dropout(probs, p=call.dropout, training=True)
        out = torch.matmul(probs, v)
    return out if dead is None else out.masked_fill(dead[:, None], 0.0)


def attend(call: Call) -> torch.Tensor:
    """Exact attention of `call` within each segment; GQA by repetition."""
    q, k, v = call.q, call.k, call.v
    total_q, heads, dim = q.shape
    starts_q, lens_q = _segments(call.cu_q, total_q, call.max_q)
    if call.cu_k is call.cu_q:
        starts_k, lens_k = starts_q, lens_q
    else:
        starts_k, lens_k = _segments(call.cu_k, k.shape[0], call.max_k)
        if lens_k.size != lens_q.size:
            raise ConfigError(
                f"cu_seqlens_k has {lens_k.size} segments, cu_seqlens has {lens_q.size}, varlen_attention, pass one offset per segment to both"
            )
    if k.shape[1] != heads:  # GQA: each kv head serves heads/kv_heads consecutive q heads
        rep = heads // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    dim_v = v.shape[-1]
    out = torch.zeros(total_q, heads, dim_v, dtype=q.dtype, device=q.device)
    live = (lens_q > 0) & (lens_k > 0)
    if not live.any():
        return out
    pairs = np.stack([lens_q[live], lens_k[live]], axis=1)
    order_idx: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []
    for lq, lk in np.unique(pairs, axis=0).tolist():  # per distinct (query, key) length, never per token
        group = live & (lens_q == lq) & (lens_k == lk)
        sq, sk = starts_q[group], starts_k[group]
        per_call = max(1, _SCORE_BUDGET // (heads * lq * lk))
        for c in range(0, sq.size, per_call):
            iq = torch.from_numpy((sq[c : c + per_call, None] + np.arange(lq)).reshape(-1)).to(q.device)
            ik = torch.from_numpy((sk[c : c + per_call, None] + np.arange(lk)).reshape(-1)).to(q.device)
            s = min(per_call, sq.size - c)

            def gather(t: torch.Tensor, idx: torch.Tensor, length: int, s: int = s) -> torch.Tensor:
                return t.index_select(0, idx).view(s, length, heads, t.shape[-1]).transpose(1, 2)

            o = _block(gather(q, iq, lq), gather(k, ik, lk), gather(v, ik, lk), call)
            outputs.append(o.transpose(1, 2).reshape(s * lq, heads, dim_v))
            order_idx.append(iq)
    return out.index_copy(0, torch.cat(order_idx), torch.cat(outputs))


def _adapter(fn: Callable[..., Any], call: Call) -> torch.Tensor:
    return attend(call)


SPEC = KernelSpec(
    name="fallback",
    summary="exact SDPA per segment length group (packtool): any device and dtype, every feature",
    adapter=_adapter,
)
