"""Proof that context-parallel batches train the same model as the unsharded packed batch (CPU,
float32 and float64), on the project's tiny model and on transformers' LlamaForCausalLM.

CP is emulated exactly: the C ranks' shards from `PackedCollator(cp_size=C, cp_rank=r)` run
side by side (position-wise layers see each rank's own tokens; attention lets every rank's queries
see the all-gathered keys/values, masked by segment and position as a CP kernel does). The only
inputs each rank uses are its own `input_ids`, `position_ids`, `shift_labels` and the segments of
its local row (`cu_seqlens_local`). Each rank's logits equal the unsharded packed logits of its
tokens, and the loss summed over ranks divided by `n_target_tokens`, with every parameter
gradient, equals `packed_cross_entropy` of the unsharded batch (1e-5); the packed batch itself
equals each document alone (tests/test_equivalence.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packtool.loader import PackedCollator, PackedDataset
from packtool.loss import packed_cross_entropy

VOCAB, TOL, PACKS = 600, 1e-5, [1, 4]


def cp_attention(q, k, v, seg: torch.Tensor, pos: torch.Tensor, scale: float) -> torch.Tensor:
    """`(T, H, D)` attention of all ranks' local tokens (rank after rank) against all of them: key j is
    visible to query i iff same segment and `pos[j] <= pos[i]` (original positions, as CP kernels)."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    scores = torch.einsum("thd,shd->hts", q, k) * scale
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def sharded(root, c: int) -> tuple[dict, list[dict], torch.Tensor, torch.Tensor]:
    """The unsharded batch, the C shards, and the emulation's segment ids and positions of the
    ranks' tokens side by side, built from what each rank holds."""
    ds = PackedDataset(root)
    full = PackedCollator(flatten=True)(ds.__getitems__(PACKS))
    shards = [PackedCollator(cp_size=c, cp_rank=r)(ds.__getitems__(PACKS)) for r in range(c)]
    seg = torch.cat([torch.from_numpy(np.repeat(np.arange(s["cu_seqlens_local"].numel() - 1),
                                                np.diff(s["cu_seqlens_local"].numpy()))) for s in shards])
    pos = torch.cat([s["position_ids"][0] for s in shards])
    return full, shards, seg, pos


def where_in_full(shards: list[dict], full: dict, c: int) -> torch.Tensor:
    """Each shard token's index in the unsharded row: the 2C-chunk definition, segment by segment."""
    cu = full["cu_seqlens"].tolist()
    out = []
    for r in range(c):
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            m = (b - a) // (2 * c)
            out += list(range(a + r * m, a + (r + 1) * m)) + list(range(a + (2 * c - 1 - r) * m, a + (2 * c - r) * m))
    return torch.tensor(out)


def check(model: torch.nn.Module, full: dict, shards: list[dict], logits_full: torch.Tensor,
          logits_cp: torch.Tensor, c: int, how: str) -> None:
    idx = where_in_full(shards, full, c)
    worst = float((logits_cp - logits_full[idx]).detach().abs().max())
    print(f"{how}: max abs logit diff CP vs unsharded {worst:.2e}")
    assert worst <= TOL
    per_rank = logits_cp.shape[0] // c
    shift = torch.cat([s["shift_labels"][0] for s in shards])
    loss_cp = sum(F.cross_entropy(logits_cp[r * per_rank:(r + 1) * per_rank], shift[r * per_rank:(r + 1) * per_rank],
                                  ignore_index=-100, reduction="sum") for r in range(c)) / shards[0]["n_target_tokens"]
    loss_full = packed_cross_entropy(logits_full, full["labels"], full["cu_seqlens"], "token")
    torch.testing.assert_close(loss_cp, loss_full, rtol=TOL, atol=TOL)
    params = [p for p in model.parameters() if p.requires_grad]
    for (name, _), a, b in zip(model.named_parameters(), torch.autograd.grad(loss_cp, params),
                               torch.autograd.grad(loss_full, params), strict=True):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m, name=name: f"{how} {name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [2, 4])
def test_tiny_model_cp_equals_unsharded(cp_stores, tiny_lm, monkeypatch, c, dtype):
    full, shards, seg, pos = sharded(cp_stores["cp"], c)
    torch.manual_seed(0)
    model = tiny_lm(VOCAB).to(dtype)
    logits_full = model(full["input_ids"][0], full["position_ids"][0], full["cu_seqlens"], full["max_seqlen"])
    # the script's model calls varlen_attention from its module globals: swap in the CP emulation
    monkeypatch.setitem(tiny_lm.forward.__globals__, "varlen_attention",
                        lambda q, k, v, cu, max_seqlen, softmax_scale: cp_attention(q, k, v, seg, pos, softmax_scale))
    ids = torch.cat([s["input_ids"][0] for s in shards])
    logits_cp = model(ids, pos, full["cu_seqlens"], full["max_seqlen"])
    check(model, full, shards, logits_full, logits_cp, c, f"tiny c={c} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_llama_cp_equals_unsharded(cp_stores, dtype):
    transformers = pytest.importorskip("transformers")
    c = 2
    full, shards, seg, pos = sharded(cp_stores["cp"], c)

    def emulation(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ANN001, ANN202
        q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))
        return cp_attention(q, k, v, seg, pos, scaling)[None], None

    transformers.AttentionInterface.register("packtool_cp_emulation", emulation)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    logits_full = model(input_ids=full["input_ids"], position_ids=full["position_ids"]).logits[0]
    model.set_attn_implementation("packtool_cp_emulation")
    ids = torch.cat([s["input_ids"][0] for s in shards])
    logits_cp = model(input_ids=ids[None], position_ids=pos[None]).logits[0]
    check(model, full, shards, logits_full, logits_cp, c, f"llama c={c} {dtype}")
