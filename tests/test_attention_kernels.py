"""The attention kernel table (`packtool/attention/kernels/`): one spec per kernel, tied to the enum users
type, and the features a model may ask for (sliding window, softcap, sinks, dropout, keys segmented apart
from queries with bottom-right causal alignment), exact in the fallback against the definition and routed
by `auto` to a kernel that has them, or refused by a forced one with the model feature named."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pytest
import torch

from packtool.attention import select_backend, varlen_attention
from packtool.attention.kernels import registry, spec
from packtool.attention.kernels.spec import FEATURES, Needs
from packtool.choices import AttentionBackend
from packtool.errors import ConfigError


def test_the_table_is_the_enum() -> None:
    """Every kernel has one spec, one module, and a name users can type; `flash` and `auto` are the two groups."""
    names = [k.name for k in registry.KERNELS]
    assert len(set(names)) == len(names)
    assert set(names) == {b.value for b in AttentionBackend} - {"auto", "flash"}
    assert tuple(n for n in names if n.startswith("flash")) == registry.FLASH
    assert names[-1] == "fallback" and registry.BY_NAME["fallback"].module is None  # takes everything: auto ends
    for kernel in registry.KERNELS:
        module = importlib.import_module(f"packtool.attention.kernels.{kernel.name}")
        assert module.SPEC is kernel, f"{kernel.name}: one module named after it, holding its SPEC"


def dense(q, k, v, cu_q, cu_k, causal=True, window=(-1, -1), softcap=None, sinks=None, scale=None):
    """One softmax per query over all keys with the segment/causal/window mask: the definition itself."""
    tq, h, d = q.shape
    k = k.repeat_interleave(h // k.shape[1], dim=1)
    v = v.repeat_interleave(h // v.shape[1], dim=1)
    seg_q = np.repeat(np.arange(len(cu_q) - 1), np.diff(cu_q))
    seg_k = np.repeat(np.arange(len(cu_k) - 1), np.diff(cu_k))
    pos_q = np.arange(tq) - np.asarray(cu_q)[seg_q]
    pos_k = np.arange(k.shape[0]) - np.asarray(cu_k)[seg_k]
    shift = (np.diff(cu_k) - np.diff(cu_q))[seg_q]  # query i of a segment sits at key i + (lk - lq)
    diag = (pos_q + shift)[:, None]
    keep = seg_q[:, None] == seg_k[None, :]
    if causal:
        keep &= pos_k[None, :] <= diag
    elif window[1] >= 0:
        keep &= pos_k[None, :] <= diag + window[1]
    if window[0] >= 0:
        keep &= pos_k[None, :] >= diag - window[0]
    keep = torch.from_numpy(keep)
    s = torch.einsum("qhd,khd->hqk", q, k) * (scale if scale is not None else 1 / math.sqrt(d))
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.reshape(h, 1, 1).expand(h, tq, 1).to(s.dtype)], dim=-1)
    p = torch.nan_to_num(s.softmax(-1), nan=0.0)[..., : k.shape[0]]
    return torch.einsum("hqk,khd->qhd", p, v)


def random_lengths(rng: np.random.Generator, n: int, low: int = 1, high: int = 14) -> list[int]:
    return [int(x) for x in rng.integers(low, high, n)]


CASES = {
    "window": {"window": (3, 3)},
    "window_noncausal": {"window": (2, 4), "causal": False},
    "softcap": {"softcap": 0.7},
    "sinks": {"sinks": True},
    "all": {"window": (4, 4), "softcap": 1.5, "sinks": True, "scale": 0.3},
    "noncausal_softcap": {"causal": False, "softcap": 2.0},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kv_extra", [0, 5], ids=["packed", "kv_cache"])
def test_fallback_features_equal_the_definition(case: str, kv_extra: int) -> None:
    """float64 values AND gradients (q, k, v, sinks); kv_extra: keys segmented apart, more keys than queries."""
    opts = dict(CASES[case])
    rng = np.random.default_rng(len(case) + kv_extra)
    lens_q = random_lengths(rng, 9)
    lens_q[3] = 0  # a static-shape empty segment
    lens_k = [lq + (int(rng.integers(0, kv_extra + 1)) if kv_extra else 0) for lq in lens_q]
    if kv_extra:
        lens_k[3] = 4  # keys without queries: nothing to compute
    cu_q, cu_k = np.concatenate([[0], np.cumsum(lens_q)]), np.concatenate([[0], np.cumsum(lens_k)])
    g = torch.Generator().manual_seed(1)
    q = torch.randn(int(cu_q[-1]), 4, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    sinks = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True) if opts.pop("sinks", False) else None
    leaves = [t for t in (q, k, v, sinks) if t is not None]
    kwargs = {"cu_seqlens_k": torch.tensor(cu_k), "max_seqlen_k": max(lens_k)} if kv_extra else {}
    out = varlen_attention(
        q, k, v, torch.tensor(cu_q), max(lens_q), causal=opts.get("causal", True),
        softmax_scale=opts.get("scale"), window=opts.get("window"), softcap=opts.get("softcap"), sinks=sinks, **kwargs,
    )
    ref = dense(q, k, v, cu_q, cu_k, opts.get("causal", True), opts.get("window", (-1, -1)), opts.get("softcap"),
                sinks, opts.get("scale"))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    up = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, leaves, up), torch.autograd.grad(ref, leaves, up), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_bottom_right_causal_decoding_and_queries_without_keys() -> None:
    """One query over a cache of keys sees them all (bottom right), not only the first (SDPA's top left);
    a segment with more queries than keys gives 0 to the queries before its first key, as flash-attn does."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 8, dtype=torch.float64, generator=g)
    k = torch.randn(6, 2, 8, dtype=torch.float64, generator=g)
    out = varlen_attention(q, k, k, torch.tensor([0, 1]), 1, cu_seqlens_k=torch.tensor([0, 6]), max_seqlen_k=6)
    full = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), k.transpose(0, 1))
    torch.testing.assert_close(out, full.transpose(0, 1))
    q3 = torch.randn(3, 2, 8, dtype=torch.float64, generator=g)
    out = varlen_attention(q3, k[:2], k[:2], torch.tensor([0, 3]), 3, cu_seqlens_k=torch.tensor([0, 2]), max_seqlen_k=2)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and out[1:].abs().min() > 0
    torch.testing.assert_close(out, dense(q3, k[:2], k[:2], [0, 3], [0, 2]))


def test_dropout_is_applied_not_ignored() -> None:
    """Dropout > 0 changes the output, differently each call, and averages back to the plain output (it is
    rescaled by 1/(1-p)): the mean of 40 draws is far closer to it than one draw, with and without softcap."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(64, 2, 8, dtype=torch.float64, generator=g)
    cu = torch.tensor([0, 30, 64])
    torch.manual_seed(0)
    for softcap in (None, 5.0):
        plain = varlen_attention(q, q, q, cu, 34, softcap=softcap)
        draws = torch.stack([varlen_attention(q, q, q, cu, 34, dropout=0.5, softcap=softcap) for _ in range(40)])
        one, mean = (draws[0] - plain).abs().mean(), (draws.mean(0) - plain).abs().mean()
        assert one > 1e-3 and not torch.equal(draws[0], draws[1])
        assert mean < 0.4 * one
    with pytest.raises(ConfigError, match=r"dropout 1.0 is outside \[0, 1\)"):
        varlen_attention(q, q, q, cu, 34, dropout=1.0)


def fake_kernels(monkeypatch, installed: dict, capability=(9, 0)) -> None:
    real = spec.load
    monkeypatch.setattr(spec, "load", lambda kernel: installed.get(kernel.name) if kernel.module else real(kernel))
    monkeypatch.setattr(spec, "capability", lambda device: capability)


def fa2(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
        causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
        return_attn_probs=False, block_table=None):
    fa2.seen = {"window_size": tuple(window_size), "softcap": softcap, "dropout_p": dropout_p, "causal": causal,
                "cu_k": cu_seqlens_k.tolist(), "max_k": max_seqlen_k}
    return varlen_attention(q.double(), k.double(), v.double(), cu_seqlens_q, max_seqlen_q, causal, softmax_scale,
                            "fallback", cu_seqlens_k=cu_seqlens_k, max_seqlen_k=max_seqlen_k, window=window_size,
                            softcap=softcap or None)


def fa4(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None, causal=False, window_size_left=None,
        window_size_right=None, learnable_sink=None, softcap=0.0):
    fa4.seen = {"left": window_size_left, "right": window_size_right, "sink": learnable_sink, "softcap": softcap}
    return torch.zeros_like(q), None


def native_213(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    native_213.seen = {"window_size": tuple(window_size), "cu_k": cu_seq_k.tolist(), "max_k": max_k}
    return torch.zeros_like(query)


def native_210(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    return torch.zeros_like(query)


def qkv(dtype=torch.bfloat16, t=20, h=4, hk=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(t, n, 16, generator=g).to(dtype) for n in (h, hk, hk)]


def test_flash_adapters_pass_each_feature_in_the_release_s_own_keywords(monkeypatch) -> None:
    fake_kernels(monkeypatch, {"flash2": fa2, "flash4": fa4})
    q, k, v = qkv()
    cu = torch.tensor([0, 8, 20])
    out = varlen_attention(q, k, v, cu, 12, window=(3, 3), softcap=30.0, backend="flash2")
    assert fa2.seen == {"window_size": (3, 3), "softcap": 30.0, "dropout_p": 0.0, "causal": True,
                        "cu_k": [0, 8, 20], "max_k": 12}
    torch.testing.assert_close(out, dense(q.double(), k.double(), v.double(), [0, 8, 20], [0, 8, 20], window=(3, 3),
                                          softcap=30.0), rtol=2e-2, atol=2e-2)
    varlen_attention(q, k, v, cu, 12, dropout=0.1, backend="flash2")
    assert fa2.seen["dropout_p"] == 0.1 and fa2.seen["window_size"] == (-1, -1)
    sinks = torch.zeros(4)
    assert select_backend(q, "auto", Needs.of(q, sinks=True)) == "flash4"  # FA2 has no sinks: auto passes it over
    varlen_attention(q, k, v, cu, 12, window=(5, 5), sinks=sinks, softcap=10.0)
    assert fa4.seen["left"] == 5 and fa4.seen["right"] == 5 and fa4.seen["sink"].dtype == q.dtype
    with pytest.raises(ConfigError, match=r"'flash4' cannot run here.*dropout_p \(needed for attention dropout"):
        varlen_attention(q, k, v, cu, 12, dropout=0.1, backend="flash4")


def test_native_takes_windows_from_2_11_and_refuses_what_it_lacks(monkeypatch) -> None:
    fake_kernels(monkeypatch, {"native": native_213})
    q, k, v = qkv()
    cu, cu_k = torch.tensor([0, 8, 20]), torch.tensor([0, 10, 30])
    k2, v2 = (torch.cat([t, t[:10]]) for t in (k, v))
    varlen_attention(q, k2, v2, cu, 12, window=(4, 4), cu_seqlens_k=cu_k, max_seqlen_k=20, backend="native")
    assert native_213.seen == {"window_size": (4, 0), "cu_k": [0, 10, 30], "max_k": 20}  # causal: right edge 0
    for feature, kwargs in (("softcap", {"softcap": 50.0}), ("sinks", {"sinks": torch.zeros(4)}),
                            ("dropout", {"dropout": 0.1})):
        assert select_backend(q, "auto", Needs.of(q, **{feature: True})) == "fallback"
        with pytest.raises(ConfigError, match=re.escape(f"needed for {FEATURES[feature]}")):
            varlen_attention(q, k, v, cu, 12, backend="native", **kwargs)
    fake_kernels(monkeypatch, {"native": native_210})
    assert select_backend(q) == "native"
    assert select_backend(q, "auto", Needs.of(q, window=True)) == "fallback"  # 2.10: no window_size
    with pytest.raises(ConfigError, match=r"no window_size \(torch >= 2.11 has\) \(needed for sliding-window"):
        varlen_attention(q, k, v, cu, 12, window=(4, 4), backend="native")


def test_auto_on_cuda_warns_when_a_feature_sends_it_to_the_fallback(monkeypatch, caplog) -> None:
    fake_kernels(monkeypatch, {"native": native_213})
    q = torch.zeros(4, 2, 16, dtype=torch.bfloat16)
    cuda = Needs(torch.device("cuda"), torch.bfloat16, 16, softcap=True)
    with caplog.at_level("WARNING", logger="packtool.attention.varlen"):
        assert select_backend(q, "auto", cuda) == "fallback"
    assert "exact SDPA fallback on CUDA" in caplog.text and "logit softcapping" in caplog.text
