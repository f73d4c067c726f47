"""Proof that packed training equals unpacked training (CPU, float32, tolerance 1e-5).

A tiny causal transformer (RoPE from `position_ids`, GQA, attention through
`varlen_attention`) run on a packed batch from `PackedDataset` + `PackedCollator` gives,
for every document, the logits it gives on that document alone; the summed loss and every
parameter gradient are the same too. Without `cu_seqlens` (one causal sequence over the
pack) the outputs differ: that is the bug packing without boundaries causes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support import Segment, write_pack_store, zipf_docs

from packtool.attention import varlen_attention
from packtool.loader import PackedCollator, PackedDataset

VOCAB, N, TOL = 97, 128, 1e-5


class TinyCausalLM(torch.nn.Module):
    """Two pre-norm blocks, RoPE on position_ids, GQA (4 q heads, 2 kv heads)."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict({
                "n1": torch.nn.LayerNorm(dim), "q": torch.nn.Linear(dim, heads * self.hd),
                "kv": torch.nn.Linear(dim, 2 * kv_heads * self.hd), "o": torch.nn.Linear(dim, dim),
                "n2": torch.nn.LayerNorm(dim), "mlp": torch.nn.Sequential(
                    torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)),
            }))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, VOCAB, bias=False)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.hd // 2
        freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = pos[:, None].float() * freq[None]
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """(T,) ids and positions -> (T, VOCAB) logits; attention only within cu_seqlens segments."""
        x = self.embed(ids)
        t = ids.shape[0]
        for blk in self.blocks:
            h = blk["n1"](x)
            q = self.rope(blk["q"](h).view(t, self.heads, self.hd), pos)
            k, v = blk["kv"](h).view(t, 2, self.kv_heads, self.hd).unbind(1)
            a = varlen_attention(q, self.rope(k, pos), v, cu, max_seqlen, softmax_scale=1 / math.sqrt(self.hd))
            x = x + blk["o"](a.reshape(t, -1))
            x = x + blk["mlp"](blk["n2"](x))
        return self.head(self.norm(x))


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF convention: labels are unshifted; position t predicts labels[t + 1]."""
    return F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Segment]]:
    root = tmp_path_factory.mktemp("eq")
    docs = zipf_docs(60, seed=11, vocab=VOCAB, max_len=200, empty_every=13)  # some longer than N: fragments
    rng = np.random.default_rng(12)
    losses = [(rng.random(d.size) < 0.8).astype(np.uint8) for d in docs]
    segs = write_pack_store(root / "packed" / "tok", docs, N, losses=losses, pad_multiple=4, pad_id=0)
    return root, segs


def _batch(root: Path, packs: list[int]) -> dict:
    ds = PackedDataset(root)
    return PackedCollator(flatten=True)(ds.__getitems__(packs))


def _alone(segs: list[Segment], packs: list[int]) -> list[tuple[int, Segment, torch.Tensor, torch.Tensor]]:
    """(flat offset, segment, ids, labels) for each segment, as it would be trained unpacked."""
    out = []
    for j, p in enumerate(packs):
        for s in (s for s in segs if s.pack == p):
            ids = torch.from_numpy(s.tokens.astype(np.int64))
            labels = torch.where(torch.from_numpy(s.loss) == 1, ids, torch.tensor(-100))
            labels[0] = -100
            out.append((j * N + s.offset, s, ids, labels))
    return out


def test_packed_equals_unpacked_logits_loss_and_gradients(packed):
    root, segs = packed
    packs = [0, 1, 2]
    batch = _batch(root, packs)
    torch.manual_seed(0)
    model = TinyCausalLM()
    ids, pos, labels = batch["input_ids"][0], batch["position_ids"][0], batch["labels"][0]
    logits = model(ids, pos, batch["cu_seqlens"], batch["max_seqlen"])
    loss_packed = summed_loss(logits, labels)
    grads_packed = torch.autograd.grad(loss_packed, list(model.parameters()))

    loss_alone = torch.zeros(())
    worst = 0.0
    docs = _alone(segs, packs)
    assert len(docs) > 10 and any(s.pad for _, s, _, _ in docs)
    for offset, _s, d_ids, d_labels in docs:
        n = d_ids.numel()
        d_logits = model(d_ids, torch.arange(n), torch.tensor([0, n], dtype=torch.int32), n)
        worst = max(worst, float((logits[offset:offset + n] - d_logits).detach().abs().max()))
        loss_alone = loss_alone + summed_loss(d_logits, d_labels)
    grads_alone = torch.autograd.grad(loss_alone, list(model.parameters()))
    print(f"max abs logit diff packed vs alone: {worst:.3g}")
    assert worst <= TOL, f"per-document logits differ by {worst}"
    assert int((labels != -100).sum()) == batch["n_target_tokens"] > 0
    torch.testing.assert_close(loss_packed, loss_alone, rtol=TOL, atol=TOL)
    for (name, _), gp, ga in zip(model.named_parameters(), grads_packed, grads_alone, strict=True):
        torch.testing.assert_close(gp, ga, rtol=TOL, atol=TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_without_cu_seqlens_documents_leak_into_each_other(packed):
    root, segs = packed
    batch = _batch(root, [0])
    torch.manual_seed(0)
    model = TinyCausalLM()
    ids, pos = batch["input_ids"][0], batch["position_ids"][0]
    good = model(ids, pos, batch["cu_seqlens"], batch["max_seqlen"])
    one_sequence = model(ids, pos, torch.tensor([0, N], dtype=torch.int32), N)
    first = _alone(segs, [0])[0][2].numel()
    torch.testing.assert_close(good[:first], one_sequence[:first])  # the first document sees nothing before it
    assert float((good[first:] - one_sequence[first:]).abs().max().detach()) > 1e-2


def test_transformers_llama_packed_equals_unpacked(packed):
    transformers = pytest.importorskip("transformers")
    root, segs = packed
    packs = [0, 1]
    batch = _batch(root, packs)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()

    def packtool_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """transformers' AttentionInterface -> varlen_attention with the collator's kwargs."""
        q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))
        out = varlen_attention(q, k, v, kwargs["cu_seq_lens_q"], kwargs["max_length_q"], softmax_scale=scaling)
        return out[None], None

    transformers.AttentionInterface.register("packtool_varlen", packtool_attention)
    docs = _alone(segs, packs)
    with torch.no_grad():
        ref = [model(input_ids=d[None]).logits[0] for _, _, d, _ in docs]
        outputs = {"sdpa (position_ids)": model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]}
        model.set_attn_implementation("packtool_varlen")
        kwargs = {k: batch[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
        outputs["varlen (cu_seq_lens)"] = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                                **kwargs).logits[0]
    for how, logits in outputs.items():
        worst = max(float((logits[o:o + d.numel()] - r).abs().max()) for (o, _, d, _), r in zip(docs, ref, strict=True))
        print(f"{how}: max abs logit diff {worst:.3g}")
        assert worst <= TOL, f"{how}: {worst}"
