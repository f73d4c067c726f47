"""FlexAttention document masks: tiles equal torch's own `create_block_mask` (which scans the dense T×T mask),
outputs equal the exact varlen fallback on real packs (CPU, float32, eager: CPU flex has no backward),
and a reused mask never keeps a previous batch's documents."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch._dynamo.exc
import torch._inductor.exc
from support import write_pack_store, zipf_docs

from packtool.attention import (
    DocumentMaskCache,
    document_block_mask,
    document_ids,
    flex_varlen_attention,
    varlen_attention,
)
from packtool.errors import ConfigError, FormatError
from packtool.loader import PackedCollator, PackedDataset

flex = pytest.importorskip("torch.nn.attention.flex_attention")
TILES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
         "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def random_cu(rng: np.random.Generator, total: int, cap: int = 300) -> torch.Tensor:
    lens: list[int] = []
    while sum(lens) < total:
        lens.append(int(min(rng.zipf(1.3), cap)))
    lens[-1] -= sum(lens) - total
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


def torch_reference_mask(cu: torch.Tensor, causal: bool, block: int):
    doc = document_ids(cu)
    t = doc.numel()

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv) if causal else doc[q] == doc[kv]

    return flex.create_block_mask(mask_mod, None, None, t, t, device="cpu", BLOCK_SIZE=block)


@pytest.fixture(scope="module")
def packed_batches(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("flex_packs")
    write_pack_store(root / "p", zipf_docs(200, seed=5, max_len=400), 512)
    ds = PackedDataset(root / "p")
    collate = PackedCollator(flatten=True)
    return [collate(ds.__getitems__([i, i + 1])) for i in range(0, 8, 2)]  # four [1, 1024] batches


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("total", "block"), [(1024, 128), (300, 128), (517, 64), (128, 128), (40, 16)])
def test_tiles_equal_create_block_mask(causal: bool, total: int, block: int) -> None:
    rng = np.random.default_rng(total + block)
    for _ in range(3):
        cu = random_cu(rng, total, cap=total // 3 + 1)
        ours = document_block_mask(cu, causal=causal, block_size=block)
        ref = torch_reference_mask(cu, causal, block)
        assert ours.shape == ref.shape == (1, 1, total, total)
        for name in TILES:
            assert torch.equal(getattr(ours, name), getattr(ref, name)), name


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2)])
def test_flex_equals_exact_fallback_on_real_packs(packed_batches: list[dict], causal: bool, heads: int,
                                                  kv_heads: int) -> None:
    g = torch.Generator().manual_seed(heads)
    for batch in packed_batches[:2]:
        cu, t = batch["cu_seqlens"], batch["input_ids"].numel()
        assert cu.numel() > 4  # several documents per batch
        q = torch.randn(t, heads, 32, generator=g)
        k, v = (torch.randn(t, kv_heads, 32, generator=g) for _ in range(2))
        want = varlen_attention(q, k, v, cu, batch["max_seqlen"], causal=causal)
        got = flex_varlen_attention(q, k, v, cu, causal=causal)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        scaled = flex_varlen_attention(q, k, v, cu, causal=causal, softmax_scale=0.05)
        torch.testing.assert_close(scaled, varlen_attention(q, k, v, cu, t, causal=causal, softmax_scale=0.05),
                                   rtol=2e-5, atol=2e-5)
        whole = flex_varlen_attention(q, k, v, torch.tensor([0, t], dtype=torch.int32), causal=causal)
        assert (whole - want).abs().max() > 1e-2  # without the document mask, documents see each other


def test_reused_mask_follows_the_new_batch(packed_batches: list[dict]) -> None:
    """Same shape, different documents: the cached mask (same object) is exact for each batch in turn."""
    cache = DocumentMaskCache()
    g = torch.Generator().manual_seed(0)
    first = None
    for batch in packed_batches:
        cu, t = batch["cu_seqlens"], batch["input_ids"].numel()
        mask = cache(cu)
        first = first or mask
        assert mask is first  # one object per shape, refreshed in place
        fresh = document_block_mask(cu)
        for name in TILES:
            assert torch.equal(getattr(mask, name), getattr(fresh, name)), name
        q, k, v = (torch.randn(t, 2, 16, generator=g) for _ in range(3))
        want = varlen_attention(q, k, v, cu, batch["max_seqlen"])
        torch.testing.assert_close(flex_varlen_attention(q, k, v, block_mask=mask), want, rtol=2e-5, atol=2e-5)
    # the hazard the refresh prevents: the first batch's documents applied to the last batch
    stale = document_block_mask(packed_batches[0]["cu_seqlens"])
    assert not torch.equal(packed_batches[0]["cu_seqlens"], packed_batches[-1]["cu_seqlens"])
    assert (flex_varlen_attention(q, k, v, block_mask=stale) - want).abs().max() > 1e-2
    other = cache(torch.tensor([0, 100, 300], dtype=torch.int32))  # another shape: its own mask
    assert other is not first and other.shape == (1, 1, 300, 300)


def test_document_ids_and_errors() -> None:
    cu = torch.tensor([0, 3, 3, 5, 8], dtype=torch.int32)  # a zero-length segment (static padding)
    assert document_ids(cu).tolist() == [0, 0, 0, 2, 2, 3, 3, 3]
    with pytest.raises(FormatError, match="decreases"):
        document_block_mask(torch.tensor([0, 5, 3, 8], dtype=torch.int32))
    with pytest.raises(FormatError, match="expected 0 to 10"):
        document_block_mask(cu, 10)
    q = torch.randn(8, 2, 4)
    with pytest.raises(ConfigError, match="block_mask is for .16, 16. tokens, q has 8"):
        flex_varlen_attention(q, q, q, block_mask=document_block_mask(torch.tensor([0, 16], dtype=torch.int32)))
    with pytest.raises(ConfigError, match="pass cu_seqlens or block_mask"):
        flex_varlen_attention(q, q, q)
    with pytest.raises(ConfigError, match="kv heads dividing q heads"):
        flex_varlen_attention(q, q[:, :1].expand(8, 3, 4).contiguous(), q[:, :1].expand(8, 3, 4).contiguous(), cu)


def test_transformers_uses_the_mask_for_a_packed_llama() -> None:
    """transformers' flex_attention path takes the BlockMask as `attention_mask`: each document's logits equal
    running it alone (float32, CPU; transformers compiles flex_attention, so this needs a C++ compiler)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    lens = [37, 90, 1, 64]
    docs = [torch.randint(0, 97, (n,)) for n in lens]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
    ids = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    model.set_attn_implementation("flex_attention")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            packed = model(input_ids=ids, position_ids=pos, attention_mask=document_block_mask(cu)).logits[0]
        except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as exc:
            pytest.skip(f"inductor cannot build CPU kernels here (no C++ compiler?): {type(exc).__name__}")
        model.set_attn_implementation("eager")
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
        model.set_attn_implementation("flex_attention")
        one_doc = document_block_mask(torch.tensor([0, ids.shape[1]], dtype=torch.int32))
        leaky = model(input_ids=ids, position_ids=pos, attention_mask=one_doc).logits[0]
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)
    assert (leaky - alone).abs().max() > 1e-3  # the mask passed is the one used: a one-document mask leaks
