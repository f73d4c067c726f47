"""DocumentDataset, the padding-free minibatch (PackedCollator(flatten=True)) and PaddedCollator,
against the token store's definition, on stores built by the real `packtool tokenize`."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from packtool.errors import ConfigError
from packtool.formats.token_store import open_token_store
from packtool.loader import DocumentDataset, PackedCollator, PaddedCollator


def reference(store_path, d: int) -> dict[str, np.ndarray]:
    """Document d as the contract defines it, straight from the store's files."""
    store = open_token_store(store_path)
    ids = store.document(d).astype(np.int64)
    a, b = int(store.starts[d]), int(store.boundaries[d])
    keep = np.ones(ids.size, bool) if store.loss is None else np.asarray(store.loss[a:b]) == 1
    labels = np.where(keep, ids, -100)
    labels[:1] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": np.arange(ids.size)}


@pytest.mark.parametrize("kind", ["text", "pc", "u32"])
def test_every_document_matches_the_store(document_stores, kind):
    path = document_stores[kind]
    ds = DocumentDataset(path)
    store = open_token_store(path)
    assert len(ds) == store.n_documents and ds.lengths.sum() == store.n_tokens
    if kind == "u32":
        assert store.dtype == np.dtype("<u4") and int(store.tokens.max()) > 65535
    if kind == "text":
        assert int((ds.lengths == 0).sum()) == 3
    if kind == "pc":
        assert store.loss is not None and 0 < store.manifest["n_target_tokens"] < store.n_tokens
    for d in range(len(ds)):
        item, ref = ds[d], reference(path, d)
        for key, want in ref.items():
            assert item[key].dtype == torch.int64
            np.testing.assert_array_equal(item[key].numpy(), want, err_msg=f"doc {d} {key}")
        n = ref["input_ids"].size
        assert item["cu_seqlens"].dtype == torch.int32 and item["cu_seqlens"].tolist() == [0, n]
        assert item["max_seqlen"] == n
        assert item["n_target_tokens"] == int((ref["labels"] != -100).sum())
    assert ds[-1]["input_ids"].numel() == ds.lengths[-1]


def test_flattened_minibatch_is_the_documents_back_to_back(document_stores):
    path = document_stores["pc"]
    ds = DocumentDataset(path)
    idx = [3, 0, 199, 3, 57, 120]
    batch = PackedCollator(flatten=True)(ds.__getitems__(idx))
    refs = [reference(path, d) for d in idx]
    lens = [r["input_ids"].size for r in refs]
    for key in ("input_ids", "labels", "position_ids"):
        assert batch[key].shape == (1, sum(lens))
        np.testing.assert_array_equal(batch[key][0].numpy(), np.concatenate([r[key] for r in refs]))
    cu = np.concatenate(([0], np.cumsum(lens)))
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"].tolist() == cu.tolist()
    assert batch["cu_seq_lens_q"].tolist() == cu.tolist() and batch["max_seqlen"] == max(lens) == batch["max_length_k"]
    assert batch["n_target_tokens"] == int((batch["labels"] != -100).sum())
    assert "cu_seqlens_q_padded" not in batch  # nothing is padded
    # a plain list of item dicts (another collate path) gives the same batch
    same = PackedCollator(flatten=True)([ds[d] for d in idx])
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        assert torch.equal(same[key], batch[key])


def test_empty_documents_are_zero_length_segments(document_stores):
    ds = DocumentDataset(document_stores["text"])
    empty = np.flatnonzero(ds.lengths == 0).tolist()
    idx = [0, *empty, 1]
    batch = PackedCollator(flatten=True)(ds.__getitems__(idx))
    lens = np.diff(batch["cu_seqlens"].numpy())
    np.testing.assert_array_equal(lens, ds.lengths[idx])
    only_empty = PackedCollator(flatten=True)(ds.__getitems__(empty))
    assert only_empty["input_ids"].shape == (1, 0) and only_empty["cu_seqlens"].tolist() == [0, 0, 0, 0]


def test_pad_to_length_and_keys_work_on_documents(document_stores):
    ds = DocumentDataset(document_stores["text"])
    idx = [10, 11, 12]
    total = int(ds.lengths[idx].sum())
    batch = PackedCollator(flatten=True, pad_to_length=total + 7, pad_id=ds.pad_id)(ds.__getitems__(idx))
    assert batch["input_ids"].shape == (1, total + 7)
    assert batch["cu_seqlens"][-2:].tolist() == [total, total + 7]
    assert bool(torch.all(batch["labels"][0, total:] == -100)) and bool(torch.all(batch["input_ids"][0, total:] == ds.pad_id))


def test_stacking_documents_of_different_lengths_is_refused(document_stores):
    ds = DocumentDataset(document_stores["text"])
    a = int(np.flatnonzero(ds.lengths > 0)[0])
    idx = [a, int(np.flatnonzero((ds.lengths > 0) & (ds.lengths != ds.lengths[a]))[0])]
    for items in (ds.__getitems__(idx), [ds[i] for i in idx]):
        with pytest.raises(ConfigError, match="flatten=True"):
            PackedCollator()(items)


@pytest.mark.parametrize("round_to", [1, 8])
def test_padded_collator_rows_are_the_documents_right_padded(document_stores, round_to):
    path = document_stores["u32"]
    ds = DocumentDataset(path)
    idx = [7, 2, 90, 41]
    pad = 5
    for items in (ds.__getitems__(idx), [ds[d] for d in idx]):
        batch = PaddedCollator(pad_id=pad, round_to=round_to)(items)
        longest = int(ds.lengths[idx].max())
        width = -(-longest // round_to) * round_to
        assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (4, width)
        for r, d in enumerate(idx):
            ref, n = reference(path, d), int(ds.lengths[d])
            np.testing.assert_array_equal(batch["input_ids"][r, :n].numpy(), ref["input_ids"])
            np.testing.assert_array_equal(batch["labels"][r, :n].numpy(), ref["labels"])
            assert bool(torch.all(batch["input_ids"][r, n:] == pad)) and bool(torch.all(batch["labels"][r, n:] == -100))
            assert batch["attention_mask"][r].tolist() == [1] * n + [0] * (width - n)
            assert batch["position_ids"][r].tolist() == list(range(width))
        assert batch["lengths"].tolist() == ds.lengths[idx].tolist()
        assert batch["n_target_tokens"] == int((batch["labels"] != -100).sum())


def test_dataset_pickles_without_maps_and_refuses_bad_input(document_stores, tmp_path):
    ds = DocumentDataset(document_stores["pc"])
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._store is None
    assert torch.equal(clone[5]["labels"], ds[5]["labels"])
    with pytest.raises(IndexError):
        ds.__getitems__([len(ds)])
    with pytest.raises(Exception, match="packtool tokenize"):
        DocumentDataset(tmp_path)
    with pytest.raises(ConfigError, match="round_to"):
        PaddedCollator(round_to=0)


def test_dataloader_workers_give_the_same_batches(document_stores):
    ds = DocumentDataset(document_stores["text"])
    batches = [[0, 1, 2], [5, 6], [299, 10, 11, 12]]

    def run(workers: int) -> list[dict]:
        loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=workers,
                                             collate_fn=PackedCollator(flatten=True))
        return list(loader)

    for a, b in zip(run(0), run(2), strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["cu_seqlens"], b["cu_seqlens"])
