"""`PackedCollator(seq_idx=True)`: the per-token document index of transformers' DataCollatorWithFlattening."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import make_store, write_pack_store, zipf_docs

from packtool.loader import DocumentDataset, PackedCollator, PackedDataset

transformers = pytest.importorskip("transformers")


def _hf(features: list[dict]) -> dict:
    collator = transformers.DataCollatorWithFlattening(return_seq_idx=True, return_flash_attn_kwargs=True)
    return collator(features)


@pytest.mark.parametrize("lengths", [[5, 1, 17, 3, 40, 2], [7], [4, 4, 4]])
def test_document_batches_match_data_collator_with_flattening(tmp_path, lengths) -> None:
    lengths = np.array(lengths)
    ds = DocumentDataset(make_store(tmp_path / "tok", lengths, with_loss=True))
    idx = list(range(len(lengths)))
    ours = PackedCollator(flatten=True, seq_idx=True)(ds.__getitems__(idx))
    items = [ds[i] for i in idx]
    hf = _hf([{"input_ids": it["input_ids"].tolist(), "labels": it["labels"].tolist()} for it in items])
    for key in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert ours[key].dtype == hf[key].dtype, key
        assert torch.equal(ours[key], hf[key]), key
    assert ours["max_length_q"] == hf["max_length_q"] and ours["max_length_k"] == hf["max_length_k"]
    assert ours["seq_idx"].dtype == torch.int32 and ours["seq_idx"].shape == (1, int(lengths.sum()))
    # the per-item path (items built elsewhere, no __getitems__) gives the same batch
    again = PackedCollator(flatten=True, seq_idx=True)(items)
    assert torch.equal(again["seq_idx"], ours["seq_idx"])


def test_empty_documents_take_an_index_as_in_data_collator_with_flattening(tmp_path) -> None:
    lengths = np.array([5, 0, 3, 0, 0, 2])
    ds = DocumentDataset(make_store(tmp_path / "tok", lengths))
    ours = PackedCollator(flatten=True, seq_idx=True)(ds.__getitems__(range(6)))
    hf = _hf([{"input_ids": ds[i]["input_ids"].tolist()} for i in range(6)])  # (its labels gain a -100 per empty doc)
    for key in ("input_ids", "position_ids", "seq_idx", "cu_seq_lens_q"):
        assert torch.equal(ours[key], hf[key]), key
    assert ours["seq_idx"].tolist() == [[0] * 5 + [2] * 3 + [5] * 2]


def test_pack_rows_number_segments_across_the_batch_tail_padding_included(tmp_path) -> None:
    docs = zipf_docs(60, seed=3, max_len=40)
    write_pack_store(tmp_path / "p", docs, 64)
    ds = PackedDataset(tmp_path / "p")
    batch = ds.__getitems__([0, 1, 2])
    rows = PackedCollator(seq_idx=True)(batch)
    flat = PackedCollator(flatten=True, seq_idx=True)(batch)
    seq, cu = rows["seq_idx"], rows["cu_seqlens"].numpy()
    assert seq.shape == rows["input_ids"].shape == (3, 64) and seq.dtype == torch.int32
    assert torch.equal(flat["seq_idx"], seq.reshape(1, -1))  # the same numbers in both layouts
    # every token's index is the segment of the global cu_seqlens that holds it (tail padding is a segment)
    expected = np.searchsorted(cu, np.arange(cu[-1]), side="right") - 1
    assert np.array_equal(seq.reshape(-1).numpy(), expected)
    assert np.array_equal(np.flatnonzero(np.diff(expected)) + 1, cu[1:-1][np.diff(cu)[1:] > 0])
    # rows restart the position ids where the index changes, never elsewhere
    pos = rows["position_ids"].reshape(-1).numpy()
    assert np.array_equal(pos == 0, np.r_[True, np.diff(expected) != 0])


def test_pad_to_length_and_static_segments(tmp_path) -> None:
    docs = zipf_docs(40, seed=5, max_len=30)
    write_pack_store(tmp_path / "p", docs, 48)
    ds = PackedDataset(tmp_path / "p")
    b = PackedCollator(flatten=True, seq_idx=True, pad_to_length=160, static_segments=64)(ds.__getitems__([0, 1]))
    seq = b["seq_idx"][0].numpy()
    assert seq.shape == (160,)
    n_real = int(np.unique(seq[:96]).size)
    assert np.all(seq[96:] == n_real)  # the appended padding is one more segment
    assert b["cu_seqlens"].numel() == 65  # static cu_seqlens keep their zero-length tail, seq_idx is per token


def test_context_parallel_shards_carry_the_unsharded_indices(tmp_path) -> None:
    docs = zipf_docs(50, seed=7, max_len=40)
    write_pack_store(tmp_path / "p", docs, 64, pad_multiple=4)
    ds = PackedDataset(tmp_path / "p")
    batch = ds.__getitems__([0, 1])
    full = PackedCollator(flatten=True, seq_idx=True)(batch)
    shards = [PackedCollator(cp_size=2, cp_rank=r, seq_idx=True)(batch) for r in range(2)]
    for s in shards:
        # position_ids are positions of the unsharded sequence: map each local token back through them
        assert s["seq_idx"].shape == s["input_ids"].shape and s["seq_idx"].dtype == torch.int32
    cu = full["cu_seqlens"].numpy()
    for r, s in enumerate(shards):
        local = s["seq_idx"][0].numpy()
        starts = cu[local]  # the segment start of each local token in the unsharded row
        unsharded = starts + s["position_ids"][0].numpy()
        assert np.array_equal(full["seq_idx"][0].numpy()[unsharded], local), r
        assert np.array_equal(full["input_ids"][0].numpy()[unsharded], s["input_ids"][0].numpy()), r
    both = np.concatenate([s["seq_idx"][0].numpy() for s in shards])
    assert np.array_equal(np.bincount(both), np.diff(cu))  # every token of every segment on exactly one rank


def test_off_by_default_and_filtered_by_keys(tmp_path) -> None:
    ds = DocumentDataset(make_store(tmp_path / "tok", np.array([3, 4])))
    assert "seq_idx" not in PackedCollator(flatten=True)(ds.__getitems__([0, 1]))
    keyed = PackedCollator(flatten=True, seq_idx=True, keys=("input_ids", "seq_idx"))(ds.__getitems__([0, 1]))
    assert set(keyed) == {"input_ids", "seq_idx"}
    assert keyed["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 1, 1]]
