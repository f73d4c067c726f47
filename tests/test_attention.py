"""varlen_attention's fallback against a dense block-diagonal reference, values and gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from packtool.attention import flash_available, varlen_attention
from packtool.errors import ConfigError, FormatError


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: list[int], causal: bool,
                    scale: float | None = None) -> torch.Tensor:
    """One softmax over all tokens with a block-diagonal (causal) mask: the definition itself."""
    t, h, d = q.shape
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    seg = np.repeat(np.arange(len(cu) - 1), np.diff(cu))
    allowed = torch.from_numpy(seg[:, None] == seg[None, :])
    if causal:
        allowed &= torch.ones(t, t, dtype=torch.bool).tril()
    scores = torch.einsum("qhd,khd->hqk", q, k) * (scale if scale is not None else 1 / math.sqrt(d))
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def random_cu(rng: np.random.Generator, total: int, zero_segments: int = 2) -> list[int]:
    lens = list(np.minimum(rng.zipf(1.5, size=200), 60))
    cu = [0]
    while cu[-1] < total:
        cu.append(min(total, cu[-1] + int(lens.pop())))
    for _ in range(zero_segments):  # static-shape padding: repeated offsets
        at = int(rng.integers(0, len(cu)))
        cu.insert(at, cu[at])
    return cu


@pytest.mark.parametrize(("causal", "heads", "kv_heads"), [(True, 4, 4), (True, 4, 2), (True, 6, 1), (False, 4, 2)])
def test_fallback_equals_block_diagonal_reference(causal, heads, kv_heads):
    rng = np.random.default_rng(heads * 10 + kv_heads)
    total, dim = 300, 16
    cu = random_cu(rng, total)
    q = torch.randn(total, heads, dim, dtype=torch.float64, requires_grad=True)
    k = torch.randn(total, kv_heads, dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(total, kv_heads, dim, dtype=torch.float64, requires_grad=True)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out = varlen_attention(q, k, v, cu_t, int(np.diff(cu).max()), causal=causal)
    ref = dense_reference(q, k, v, cu, causal)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_softmax_scale_and_float32():
    rng = np.random.default_rng(0)
    cu = random_cu(rng, 128, zero_segments=0)
    q, k, v = (torch.randn(128, 2, 8) for _ in range(3))
    out = varlen_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), 128, softmax_scale=0.05)
    torch.testing.assert_close(out, dense_reference(q, k, v, cu, True, scale=0.05), rtol=1e-5, atol=1e-5)


def test_one_segment_is_plain_causal_attention_and_segments_do_not_leak():
    q, k, v = (torch.randn(64, 2, 8, dtype=torch.float64) for _ in range(3))
    whole = varlen_attention(q, k, v, torch.tensor([0, 64], dtype=torch.int32), 64)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True).transpose(0, 1)
    torch.testing.assert_close(whole, sdpa)
    split = varlen_attention(q, k, v, torch.tensor([0, 30, 64], dtype=torch.int32), 34)
    torch.testing.assert_close(split[:30], whole[:30])
    assert (split[30:] - whole[30:]).abs().max() > 1e-3  # the second segment no longer sees the first


@pytest.mark.parametrize(("cu", "max_len", "error", "message"), [
    ([0, 10, 5, 32], 32, FormatError, "decreases at entry 2"),
    ([0, 10, 30], 32, FormatError, "expected 0 to 32"),
    ([0, 10, 32], 8, FormatError, "max_seqlen 8 is below"),
])
def test_bad_cu_seqlens_raise(cu, max_len, error, message):
    q = torch.randn(32, 2, 4)
    with pytest.raises(error, match=message):
        varlen_attention(q, q, q, torch.tensor(cu, dtype=torch.int32), max_len)


def test_bad_shapes_raise():
    q = torch.randn(32, 3, 4)
    kv = torch.randn(32, 2, 4)
    cu = torch.tensor([0, 32], dtype=torch.int32)
    with pytest.raises(ConfigError, match="not a multiple of key/value heads"):
        varlen_attention(q, kv, kv, cu, 32)
    with pytest.raises(ConfigError, match=r"\(total_tokens, heads, head_dim\)"):
        varlen_attention(q[None], q[None], q[None], cu, 32)
    with pytest.raises(ConfigError, match="flash-attn is not usable"):
        varlen_attention(q, q, q, cu, 32, backend="flash")
    assert not flash_available(q)
