"""flash-attn's varlen kernel vs packtool's exact fallback on real packs (bf16, CUDA only)."""

from __future__ import annotations

import pytest
import torch
from support import write_pack_store, zipf_docs

from packtool.attention import flash_available, varlen_attention
from packtool.loader import PackedCollator, PackedDataset

pytestmark = pytest.mark.gpu
needs_flash = pytest.mark.skipif(
    not torch.cuda.is_available() or not flash_available(torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu", dtype=torch.bfloat16)),
    reason="needs a CUDA GPU and flash-attn")


@needs_flash
@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (8, 2)])
def test_flash_matches_fallback_forward_and_backward(tmp_path, heads, kv_heads):
    write_pack_store(tmp_path / "p", zipf_docs(400, seed=2, max_len=1500, empty_every=31), 2048, pad_multiple=8)
    ds = PackedDataset(tmp_path / "p")
    batch = PackedCollator(flatten=True)(ds.__getitems__(list(range(min(4, len(ds))))))
    cu, max_len = batch["cu_seqlens"].cuda(), batch["max_seqlen"]
    t = batch["input_ids"].numel()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, heads, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(t, kv_heads, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(t, kv_heads, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    grad = torch.randn(t, heads, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    outs, grads = [], []
    for backend in ("flash", "torch"):
        out = varlen_attention(q, k, v, cu, max_len, backend=backend)
        outs.append(out.float())
        grads.append([x.float() for x in torch.autograd.grad(out, (q, k, v), grad)])
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2)
