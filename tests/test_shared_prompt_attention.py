"""The shared-prompt layout at the attention level: the exact fallback and FlexAttention against a dense mask.

Each query's visible keys are those of its sequence alone (prompt + its completion, causal in the
sequence's own positions, within a sliding window); the reference is a dense masked softmax.
Kernels that cannot align causal attention to the bottom right refuse by name.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from packtool.attention import shared_prompt_attention, shared_prompt_block_mask, shared_prompt_layout
from packtool.attention.kernels import flash2, flash_api, native
from packtool.attention.kernels.spec import Needs
from packtool.errors import ConfigError, FormatError

LENS = [5, 3, 4, 0, 2, 6, 1, 0, 3, 2]  # pairs (P, C, R) of (5,3,4), (0,2,6), (1,0,3), then a pad of 2
PREFIX = [-1, 0, 0, -1, 3, 3, -1, 6, 6, -1]


def dense_mask(lens: list[int], prefix: list[int], window: int | None) -> torch.Tensor:
    total = sum(lens)
    starts = [sum(lens[:i]) for i in range(len(lens))]
    seg = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.tensor([i - starts[s] + (lens[prefix[s]] if prefix[s] >= 0 else 0) for i, s in enumerate(seg.tolist())])
    mask = torch.zeros(total, total, dtype=torch.bool)
    for i in range(total):
        s = int(seg[i])
        for j in range(total):
            t = int(seg[j])
            if (t == s and j <= i) or (prefix[s] >= 0 and t == prefix[s]):
                mask[i, j] = window is None or int(pos[i] - pos[j]) < window
    return mask


def reference(q, k, v, mask, softcap=None):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1).nan_to_num(0.0), v)


def qkv(dtype=torch.float64, heads=4, kv=2, dim=8):
    g = torch.Generator().manual_seed(0)
    total = sum(LENS)
    return tuple(torch.randn(total, h, dim, generator=g, dtype=dtype) for h in (heads, kv, kv))


CU = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()])


@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 0.7), (2, 0.5)])
def test_fallback_equals_each_sequence_alone(window, softcap) -> None:
    q, k, v = qkv()
    got = shared_prompt_attention(q, k, v, CU, torch.tensor(PREFIX), backend="fallback", softcap=softcap,
                                  window=None if window is None else (window - 1, window - 1))  # fmt: skip
    want = reference(q, k, v, dense_mask(LENS, PREFIX, window), softcap)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_layout_gathers_each_completion_behind_its_prompt() -> None:
    lay = shared_prompt_layout(CU, torch.tensor(PREFIX))
    assert lay.cu_q.tolist() == [0, 8, 12, 14, 20, 21, 24, 26]  # [P+C] [R] [P'+C'] [R'] [P''+C''] [R''] [pad]
    assert lay.cu_k.tolist() == [0, 8, 17, 19, 25, 26, 30, 32]
    assert lay.index_k[8:17].tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11]
    plain = shared_prompt_layout(torch.tensor([0, 3, 5]), torch.tensor([-1, -1]))
    assert plain.index_k is None and plain.cu_k is plain.cu_q


def test_flex_block_mask_equals_the_dense_reference() -> None:
    from packtool.attention import flex_varlen_attention

    q, k, v = (t.float() for t in qkv(heads=2, kv=2))
    mask = shared_prompt_block_mask(CU, torch.tensor(PREFIX))
    got = flex_varlen_attention(q, k, v, block_mask=mask, compiled=False)
    want = reference(q, k, v, dense_mask(LENS, PREFIX, None))
    live = torch.tensor(LENS).sum()
    assert torch.allclose(got[:live], want[:live], atol=1e-5)


def test_bad_prefix_segment_is_refused() -> None:
    q, k, v = qkv()
    with pytest.raises(FormatError, match="another completion's prompt"):
        shared_prompt_attention(q, k, v, CU, torch.tensor([-1, 0, 1, -1, 3, 3, -1, 6, 6, -1]))
    with pytest.raises(FormatError, match="one value per segment"):
        shared_prompt_attention(q, k, v, CU, torch.tensor([-1, 0]))
    with pytest.raises(ConfigError, match="covers"):
        shared_prompt_attention(q[:-1], k[:-1], v[:-1], CU, torch.tensor(PREFIX))


def test_kernels_without_bottom_right_causal_refuse_it_by_name(monkeypatch) -> None:
    needs = Needs(torch.device("cuda"), torch.float16, 64, shared_prompt=True, varlen_kv=True)
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(__version__="2.0.9"))
    assert "shared-prompt layout" in flash2.check(lambda q, k, v, cu_seqlens_k=None: None, needs)
    monkeypatch.setitem(sys.modules, "flash_attn", types.SimpleNamespace(__version__="2.8.3"))
    assert flash2.check(lambda q, k, v, cu_seqlens_q=None, cu_seqlens_k=None: None, needs) is None
    assert "shared-prompt layout" in flash_api.check(lambda q, k, v, cu_seqlens_q=None: None, needs)
    from torch.nn.attention import varlen

    monkeypatch.setattr(varlen, "_should_use_cudnn", lambda index: True, raising=False)
    assert "shared-prompt layout" in native.check(lambda *a, window_size=None: None, needs)
    monkeypatch.setattr(varlen, "_should_use_cudnn", lambda index: False, raising=False)
    assert native.check(lambda *a, window_size=None: None, needs) is None
