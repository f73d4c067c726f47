"""PackedCollator(cp_size=C, cp_rank=r) on packs built by the real `packtool tokenize` + `packtool pack`:
exactly the load-balanced 2C split with global cu_seqlens, a CPU emulation of CP attention equal to
unsharded `varlen_attention`, balanced causal work, labels that shard correctly, and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packtool.attention import varlen_attention
from packtool.errors import ConfigError
from packtool.loader import DocumentDataset, PackedCollator, PackedDataset
from packtool.loss import packed_cross_entropy

N = 256  # the pack size of conftest's cp_stores


def expected_indices(cu: np.ndarray, c: int, r: int) -> np.ndarray:
    """The definition, segment by segment in plain Python: chunks r and 2C-1-r of 2C equal chunks."""
    out = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        m = (b - a) // (2 * c)
        out += list(range(a + r * m, a + (r + 1) * m)) + list(range(a + (2 * c - 1 - r) * m, a + (2 * c - r) * m))
    return np.array(out, np.int64)


def batches(root: Path, packs: list[int], c: int) -> tuple[dict, list[dict]]:
    ds = PackedDataset(root)
    full = PackedCollator(flatten=True)(ds.__getitems__(packs))
    return full, [PackedCollator(cp_size=c, cp_rank=r)(ds.__getitems__(packs)) for r in range(c)]


@pytest.mark.parametrize("c", [2, 4])
def test_each_rank_holds_exactly_its_two_chunks_of_every_segment(cp_stores, c):
    packs = [0, 3, 1]
    full, shards = batches(cp_stores["cp"], packs, c)
    cu = full["cu_seqlens"].numpy()
    assert np.any(np.diff(cu) != N)  # several segments per pack, tail padding included
    total = full["input_ids"].shape[1]
    for r, shard in enumerate(shards):
        idx = expected_indices(cu, c, r)
        assert idx.size == total // c
        for key in ("input_ids", "labels", "position_ids"):
            assert shard[key].shape == (1, total // c) and shard[key].dtype == torch.int64
            np.testing.assert_array_equal(shard[key][0].numpy(), full[key][0].numpy()[idx], err_msg=f"rank {r} {key}")
        for key in ("cu_seqlens", "cu_seq_lens_q", "cu_seqlens_q_padded", "cu_seqlens_kv_padded"):
            assert torch.equal(shard[key], full["cu_seqlens"]), key  # global, unsharded
        assert torch.equal(shard["cu_seqlens_q"], full["cu_seqlens_q"]) and torch.equal(shard["cu_seqlens_kv"], full["cu_seqlens_kv"])
        assert not torch.equal(shard["cu_seqlens_q"], shard["cu_seqlens_q_padded"])  # real lengths vs padded
        assert shard["max_seqlen"] == full["max_seqlen"] and shard["n_target_tokens"] == full["n_target_tokens"]
        assert shard["cu_seqlens_local"].tolist() == (cu // c).tolist()
    every = np.sort(np.concatenate([expected_indices(cu, c, r) for r in range(c)]))
    np.testing.assert_array_equal(every, np.arange(total))


def reference_cp_attention(q, k, v, idx_r, all_idx, seg, pos, scale):
    """Rank r's queries against the keys/values gathered from every rank (in shard order), masked by
    the ORIGINAL segment and position of each token: what ring/all-gather CP attention computes."""
    qr = q[idx_r]  # [t, H, D]
    kg, vg = k[all_idx], v[all_idx]
    allowed = (seg[idx_r][:, None] == seg[all_idx][None, :]) & (pos[all_idx][None, :] <= pos[idx_r][:, None])
    scores = torch.einsum("thd,shd->hts", qr, kg) * scale
    scores = scores.masked_fill(~torch.from_numpy(allowed)[None], float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), vg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [2, 4])
def test_cp_attention_emulation_equals_unsharded_varlen_attention(cp_stores, c, dtype):
    full, shards = batches(cp_stores["cp"], [2, 5], c)
    cu = full["cu_seqlens"].numpy().astype(np.int64)
    total, heads, dim = full["input_ids"].shape[1], 4, 16
    g = torch.Generator().manual_seed(c)
    q, k, v = (torch.randn(total, heads, dim, generator=g, dtype=dtype) for _ in range(3))
    ref = varlen_attention(q, k, v, full["cu_seqlens"], full["max_seqlen"], softmax_scale=dim**-0.5)
    seg = np.repeat(np.arange(cu.size - 1), np.diff(cu))
    pos = full["position_ids"][0].numpy()
    idx = [expected_indices(cu, c, r) for r in range(c)]
    all_idx = np.concatenate(idx)  # the all-gathered K/V, in rank order
    for r, shard in enumerate(shards):
        np.testing.assert_array_equal(shard["position_ids"][0].numpy(), pos[idx[r]])
        out = reference_cp_attention(q, k, v, idx[r], all_idx, seg, pos, dim**-0.5)
        torch.testing.assert_close(out, ref[idx[r]], rtol=1e-5, atol=1e-5)


def test_causal_work_is_balanced_exactly(cp_stores):
    for c in (2, 4):
        full, shards = batches(cp_stores["cp"], [0, 1, 2, 3], c)
        # query-key pairs under a causal mask within segments: position_in_segment + 1 per query
        pairs = [int((s["position_ids"][0] + 1).sum()) for s in shards]
        assert len(set(pairs)) == 1, pairs
        naive = [int((full["position_ids"][0] + 1).reshape(c, -1)[r].sum()) for r in range(c)]  # contiguous split
        assert len(set(naive)) > 1


def test_shift_labels_shard_the_unsharded_loss(cp_stores):
    c = 2
    full, shards = batches(cp_stores["cp"], [4, 0], c)
    total = full["input_ids"].shape[1]
    logits = torch.randn(total, 600, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    whole = packed_cross_entropy(logits, full["labels"], full["cu_seqlens"], "sum")
    cu = full["cu_seqlens"].numpy()
    summed = sum(
        torch.nn.functional.cross_entropy(logits[expected_indices(cu, c, r)], s["shift_labels"][0], reduction="sum")
        for r, s in enumerate(shards)
    )
    torch.testing.assert_close(summed, whole, rtol=1e-12, atol=1e-12)
    local = sum(
        packed_cross_entropy(logits[expected_indices(cu, c, r)], s["shift_labels"], s["cu_seqlens_local"], "sum", shifted=True)
        for r, s in enumerate(shards)
    )
    torch.testing.assert_close(local, whole, rtol=1e-12, atol=1e-12)


def test_static_segments_and_keys_work_with_cp(cp_stores):
    ds = PackedDataset(cp_stores["cp"])
    b = PackedCollator(cp_size=2, cp_rank=1, static_segments=64, keys=("input_ids", "cu_seqlens", "shift_labels"))(ds.__getitems__([0]))
    assert set(b) == {"input_ids", "cu_seqlens", "shift_labels"}
    assert b["cu_seqlens"].numel() == 65 and b["input_ids"].shape == (1, N // 2)


def test_stores_that_cannot_be_split_are_refused_with_the_fix(cp_stores):
    ds = PackedDataset(cp_stores["plain"])
    with pytest.raises(ConfigError, match=r"--pad-multiple 4") as err:
        PackedCollator(cp_size=2, cp_rank=0)(ds.__getitems__([0, 1]))
    assert "\n" not in str(err.value)
    odd = PackedDataset(cp_stores["odd_size"])
    with pytest.raises(ConfigError, match=r"pack size 252 is not a multiple of 2\*cp_size=8"):
        PackedCollator(cp_size=4, cp_rank=0)(odd.__getitems__([0]))
    with pytest.raises(ConfigError, match="cp_rank"):
        PackedCollator(cp_size=2, cp_rank=2)


def test_documents_are_refused_with_the_way_to_pad_them(document_stores):
    ds = DocumentDataset(document_stores["pc"])
    with pytest.raises(ConfigError, match=r"pack --pad-multiple 4` and use PackedDataset"):
        PackedCollator(cp_size=2, cp_rank=0)(ds.__getitems__([0, 1, 2]))
