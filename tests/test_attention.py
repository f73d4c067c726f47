"""varlen_attention: the exact fallback against a dense block-diagonal reference (values and gradients),
and the backend dispatch tested on CPU by substitution: fake flash-attn / torch-native kernels with
each release's real signature are installed, and each test checks which one runs, with what, and
that its result flows through (the real kernels run in tests/test_gpu.py)."""

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
    with pytest.raises(ConfigError, match="attention backend 'flash' cannot run here.*not importable"):
        varlen_attention(q, q, q, cu, 32, backend="flash")
    with pytest.raises(ConfigError, match="unknown attention backend 'cudnn'.*auto, flash, flash2"):
        varlen_attention(q, q, q, cu, 32, backend="cudnn")
    assert not flash_available(q)


# ---- backend dispatch, by substitution ----------------------------------------------------------

import functools  # noqa: E402
import inspect  # noqa: E402

from packtool.attention import native_available, select_backend  # noqa: E402
from packtool.attention.kernels import registry, spec  # noqa: E402
from packtool.attention.kernels.spec import Needs  # noqa: E402


class Kernels:
    """Fake kernels installed in place of the real imports; each records its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, installed: dict, capability: tuple[int, int] | None = (9, 0)):
        self.installed = installed
        self.calls: list[tuple[str, tuple, dict]] = []
        real = spec.load
        monkeypatch.setattr(spec, "load", lambda kernel: installed.get(kernel.name) if kernel.module else real(kernel))
        monkeypatch.setattr(spec, "capability", lambda device: capability)


def exact(q, k, v, cu, max_len, causal, scale):
    """What every real kernel computes: the fallback in float64 (the fakes return this)."""
    cu = torch.as_tensor(cu, dtype=torch.int32)
    return varlen_attention(q.double(), k.double(), v.double(), cu, int(max_len), causal, scale, backend="fallback")


def check_kernel_inputs(q, k, v, cu):
    assert cu.dtype == torch.int32 and cu.is_contiguous() and cu.ndim == 1 and cu.device == q.device
    assert all(t.stride(-1) == 1 for t in (q, k, v))


def fake_flash(calls: list, name: str, returns_lse: bool = False, with_max: bool = True):
    """flash-attn's varlen function (FA2/FA3 keyword names; FA4 without max_seqlen when `with_max=False`)."""

    def fa(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None,
           causal=False):
        check_kernel_inputs(q, k, v, cu_seqlens_q)
        assert cu_seqlens_q is cu_seqlens_k and max_seqlen_q == max_seqlen_k and type(max_seqlen_q) is int
        calls.append((name, (q, k, v), {"cu": cu_seqlens_q, "max": max_seqlen_q, "scale": softmax_scale, "causal": causal}))
        out = exact(q, k, v, cu_seqlens_q, max_seqlen_q, causal, softmax_scale)
        return (out, torch.zeros(1)) if returns_lse else out

    def fa4(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, softmax_scale=None, causal=False):
        check_kernel_inputs(q, k, v, cu_seqlens_q)
        calls.append((name, (q, k, v), {"cu": cu_seqlens_q, "scale": softmax_scale, "causal": causal}))
        total = int(cu_seqlens_q[-1])
        return exact(q, k, v, cu_seqlens_q, total, causal, softmax_scale), torch.zeros(1)

    return fa if with_max else fa4


def fake_native(calls: list, release: str):
    """torch's varlen_attn as 2.10 (is_causal), 2.11 (window_size, scale) and 2.13 (+ enable_gqa) define it;
    2.13's signature is copied from the installed torch itself."""

    def compute(query, key, value, cu_q, cu_k, max_q, max_k, causal, scale, gqa):
        check_kernel_inputs(query, key, value, cu_q)
        assert cu_q is cu_k and max_q == max_k
        if not gqa:
            assert query.shape[1] == key.shape[1], "kv heads differ without enable_gqa"
        calls.append(("native", (query, key, value), {"cu": cu_q, "max": max_q, "scale": scale, "causal": causal,
                                                       "gqa": gqa}))
        return exact(query, key, value, cu_q, max_q, causal, scale)

    if release == "2.10":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
            return compute(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, False)
    elif release == "2.11":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1)):
            return compute(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, tuple(window_size) == (-1, 0), scale,
                           False)
    else:
        from torch.nn.attention.varlen import varlen_attn as real

        @functools.wraps(real)
        def varlen_attn(*args, **kwargs):
            a = inspect.signature(real).bind(*args, **kwargs)
            a.apply_defaults()
            p = a.arguments
            return compute(p["query"], p["key"], p["value"], p["cu_seq_q"], p["cu_seq_k"], p["max_q"], p["max_k"],
                           tuple(p["window_size"]) == (-1, 0), p["scale"], p["enable_gqa"])
    return varlen_attn


def packed_qkv(dtype=torch.bfloat16, heads=4, kv_heads=2, total=200, seed=0):
    rng = np.random.default_rng(seed)
    cu = random_cu(rng, total, zero_segments=1)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total, heads, 16, generator=g).to(dtype)
    k = torch.randn(total, kv_heads, 16, generator=g).to(dtype)
    v = torch.randn(total, kv_heads, 16, generator=g).to(dtype)
    return q, k, v, cu


@pytest.mark.parametrize(("installed", "capability", "dtype", "want"), [
    (("flash2", "flash3", "flash4", "native"), (9, 0), torch.bfloat16, "flash3"),
    (("flash2", "flash4", "native"), (9, 0), torch.float16, "flash4"),
    (("flash2", "flash3", "native"), (10, 0), torch.bfloat16, "flash2"),  # FA3 is Hopper-only
    (("flash3", "flash4", "native"), (8, 0), torch.bfloat16, "native"),  # FA3/FA4 need sm90
    (("native",), (9, 0), torch.bfloat16, "native"),  # the lent GPUs: torch 2.11, no flash-attn
    (("native",), (7, 5), torch.float16, "fallback"),  # pre-Ampere
    (("flash2", "native"), (9, 0), torch.float32, "fallback"),  # kernels are fp16/bf16 only
    (("flash2", "native"), None, torch.bfloat16, "fallback"),  # CPU
    ((), (9, 0), torch.bfloat16, "fallback"),
])
def test_auto_picks_flash_then_native_then_fallback(monkeypatch, installed, capability, dtype, want):
    calls: list = []
    fakes = {"flash2": fake_flash(calls, "flash2"), "flash3": fake_flash(calls, "flash3", returns_lse=True),
             "flash4": fake_flash(calls, "flash4", with_max=False), "native": fake_native(calls, "2.13")}
    Kernels(monkeypatch, {n: fakes[n] for n in installed}, capability)
    q, k, v, cu = packed_qkv(dtype)
    assert select_backend(q) == want
    assert flash_available(q) == want.startswith("flash")
    assert native_available(q) == (want == "native" or (want.startswith("flash") and "native" in installed))
    out = varlen_attention(q, k, v, torch.tensor(cu, dtype=torch.int64), int(np.diff(cu).max()))
    if want == "fallback":
        assert calls == [] and out.dtype == dtype
    else:
        assert [c[0] for c in calls] == [want]  # the result came from the kernel: float64 from the fakes
        assert out.dtype == torch.float64
    torch.testing.assert_close(out.double(), exact(q, k, v, cu, 200, True, None), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["flash2", "flash3", "flash4"])
@pytest.mark.parametrize(("causal", "scale"), [(True, None), (False, 0.3)])
def test_flash_gets_int32_cu_seqlens_scale_causal_and_gqa(monkeypatch, name, causal, scale):
    calls: list = []
    fake = fake_flash(calls, name, returns_lse=name == "flash3", with_max=name != "flash4")
    Kernels(monkeypatch, {name: fake})
    q, k, v, cu = packed_qkv(heads=6, kv_heads=2)
    cu_in = torch.tensor(cu, dtype=torch.int64)[::1]
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # last-dim stride != 1: must be made contiguous
    max_len = int(np.diff(cu).max())
    out = varlen_attention(q_strided, k, v, cu_in, max_len, causal=causal, softmax_scale=scale, backend=name)
    [(got, (kq, kk, kv), kw)] = calls
    assert got == name and kw["scale"] == scale and kw["causal"] is causal
    assert kw["cu"].tolist() == cu and kk.shape[1] == 2  # GQA is native to flash-attn: k/v not repeated
    assert name == "flash4" or kw["max"] == max_len
    assert torch.equal(kq, q)
    torch.testing.assert_close(out, exact(q, k, v, cu, max_len, causal, scale), rtol=0, atol=0)


@pytest.mark.parametrize("release", ["2.10", "2.11", "2.13"])
@pytest.mark.parametrize(("heads", "kv_heads", "causal", "scale"), [(4, 4, True, None), (6, 2, True, 0.2),
                                                                    (4, 1, False, None)])
def test_native_adapts_to_each_torch_signature(monkeypatch, release, heads, kv_heads, causal, scale):
    calls: list = []
    Kernels(monkeypatch, {"native": fake_native(calls, release)}, (9, 0))
    q, k, v, cu = packed_qkv(heads=heads, kv_heads=kv_heads, seed=heads)
    max_len = int(np.diff(cu).max())
    out = varlen_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), max_len, causal=causal, softmax_scale=scale,
                           backend="native")
    [(_, (nq, nk, _), kw)] = calls
    assert kw["causal"] is causal and kw["max"] == max_len and kw["cu"].tolist() == cu
    assert kw["gqa"] == (release == "2.13" and kv_heads != heads)  # older releases get repeated k/v heads
    assert nk.shape[1] == (kv_heads if kw["gqa"] else heads)
    if release == "2.10":
        assert kw["scale"] is None  # no scale argument: q is rescaled instead
        assert scale is None or not torch.equal(nq, q)
    else:
        assert kw["scale"] == scale and torch.equal(nq, q)
    want = exact(q, k, v, cu, max_len, causal, scale)
    tol = 2e-2 if release == "2.10" and scale is not None else 1e-12  # a bf16 rescaled q rounds
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)


def test_forced_backends_fail_with_the_reason(monkeypatch):
    q, k, v, cu = packed_qkv(torch.float32)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    Kernels(monkeypatch, {"native": fake_native([], "2.13")}, None)
    with pytest.raises(ConfigError, match="'native' cannot run here .native: needs CUDA tensors, got cpu"):
        varlen_attention(q, k, v, cu_t, 200, backend="native")
    Kernels(monkeypatch, {"native": fake_native([], "2.13")}, (9, 0))
    with pytest.raises(ConfigError, match="needs float16 or bfloat16, got torch.float32"):
        varlen_attention(q, k, v, cu_t, 200, backend="native")
    q8 = torch.randn(200, 4, 12, dtype=torch.bfloat16)
    assert "head_dim 12" in spec.unusable(registry.BY_NAME["native"], Needs.of(q8)) and select_backend(q8) == "fallback"
    for name in ("fallback", "torch"):  # `torch`: the old name of the exact fallback
        assert select_backend(q.bfloat16(), name) == "fallback"


def test_real_environment_dispatch():
    """This machine (CPU torch 2.13): torch's varlen module imports, nothing can run but the fallback."""
    native = registry.BY_NAME["native"]
    assert spec.load(native) is not None  # torch >= 2.10 ships it
    q = torch.randn(8, 2, 16, dtype=torch.bfloat16)
    assert spec.unusable(native, Needs.of(q)) == "needs CUDA tensors, got cpu"
    assert select_backend(q) == "fallback"
