"""`PackedDataset` items and `PackedCollator` batches of preference pack stores: pair keys per segment,
sequences, positions and labels exactly those of each sequence alone (prompt + completion when shared)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packtool.errors import ConfigError
from packtool.formats.token_store import open_token_store
from packtool.loader.collator import HF_KEYS, PackedCollator
from packtool.loader.dataset import PackedDataset
from packtool.stages.pack import PackConfig, pack_store
from tests.preference_support import hostile_pairs, realistic_pairs, write_pref_store
from tests.support import make_store

SIZE = 1024


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("prefload")
    tok = write_pref_store(root / "tok", realistic_pairs(300, seed=11, scale=0.5) + hostile_pairs())
    out = {"tok": tok}
    for share in (False, True):
        pack_store(PackConfig(tok, SIZE, root / f"out{share}", share_prompt=share, overlong="drop"))
        out[share] = root / f"out{share}"
    return out


def alone(store, doc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids, labels (HF, unshifted: -100 on non-targets and the first token) and positions of a sequence alone."""
    ids = np.asarray(store.document(doc), np.int64)
    s = int(store.starts[doc])
    loss = np.asarray(store.loss[s : s + ids.size])
    labels = np.where(loss != 0, ids, -100)
    if labels.size:
        labels[0] = -100
    return ids, labels, np.arange(ids.size)


def sequences(item: dict) -> list[tuple[int, bool, np.ndarray, np.ndarray, np.ndarray]]:
    """(pair, chosen, ids, labels, positions) of every sequence of an item (prompt + completion when shared)."""
    cu = item["cu_seqlens"].numpy()
    ids, labels, pos = (item[k].numpy() for k in ("input_ids", "labels", "position_ids"))
    pair, chosen, prefix = (item[k].numpy() for k in ("pair_ids", "chosen", "prefix_segment"))
    prompts = set(prefix[prefix >= 0].tolist())
    out = []
    for s in range(cu.size - 1):
        if pair[s] < 0 or s in prompts:
            continue
        parts = ([prefix[s]] if prefix[s] >= 0 else []) + [s]
        ids_s, labels_s, pos_s = (np.concatenate([a[cu[j] : cu[j + 1]] for j in parts]) for a in (ids, labels, pos))
        out.append((int(pair[s]), bool(chosen[s]), ids_s, labels_s, pos_s))
    return out


@pytest.mark.parametrize("share", [False, True])
def test_items_decode_back_to_the_token_store(stores, share):
    store = open_token_store(stores["tok"])
    ds = PackedDataset(stores[share], size=SIZE)
    assert ds.preference and ds.shared_prompt == share
    seen = []
    for i in range(len(ds)):
        item = ds[i]
        n_seg = item["cu_seqlens"].numel() - 1
        assert all(item[k].numel() == n_seg for k in ("pair_ids", "chosen", "prefix_segment"))
        assert item["pair_ids"].dtype == torch.int64 and item["chosen"].dtype == torch.bool
        for q, chosen, ids, labels, pos in sequences(item):
            want = alone(store, 2 * q + (0 if chosen else 1))
            for got, exp in zip((ids, labels, pos), want, strict=True):
                assert np.array_equal(got, exp), (q, chosen)
            seen.append((q, chosen))
        n_target = sum(int((lab != -100).sum()) for *_, lab, _ in sequences(item))
        assert item["n_target_tokens"] == n_target  # the prompt is never a target, padding neither
    assert sorted(seen) == sorted({(q, c) for q, c in seen}) and len(seen) == 2 * len({q for q, _ in seen})


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("flatten", [False, True])
def test_batches_carry_global_pair_keys(stores, share, flatten):
    ds = PackedDataset(stores[share], size=SIZE)
    idx = [0, 1, 2]
    items = [ds[i] for i in idx]
    fast = PackedCollator(flatten=flatten)(ds.__getitems__(idx))
    slow = PackedCollator(flatten=flatten)(items)  # item dicts built elsewhere: same batch
    for k in ("input_ids", "labels", "position_ids", "cu_seqlens", "pair_ids", "chosen", "prefix_segment"):
        assert torch.equal(fast[k].reshape(-1), slow[k].reshape(-1)), k
    base = 0
    for it in items:  # global = item-local + the segments before
        n = it["pair_ids"].numel()
        assert torch.equal(fast["pair_ids"][base : base + n], it["pair_ids"])
        local = it["prefix_segment"]
        assert torch.equal(fast["prefix_segment"][base : base + n], torch.where(local >= 0, local + base, local))
        base += n
    assert fast["pair_ids"].numel() == fast["cu_seqlens"].numel() - 1
    assert bool((fast["prefix_segment"] >= 0).any()) == share


def test_static_shapes_pad_to_length_and_seq_idx_refused_when_shared(stores):
    ds = PackedDataset(stores[True], size=SIZE)
    plain = PackedCollator()(ds.__getitems__([0, 1]))
    padded = PackedCollator(pad_to_length=SIZE + 16, static_segments=80)(ds.__getitems__([0, 1]))
    k = plain["pair_ids"].numel()
    assert padded["pair_ids"].numel() == 80 == padded["cu_seqlens"].numel() - 1
    keep = padded["pair_ids"][: k + 2]
    inserted = torch.tensor(
        [i for i in range(k + 2) if keep[i] < 0 and padded["cu_seqlens"][i + 1] - padded["cu_seqlens"][i] == 16]
    )
    assert inserted.numel() == 2  # one pad_to_length segment per row
    mask = torch.ones(k + 2, dtype=torch.bool)
    mask[inserted] = False
    assert torch.equal(padded["pair_ids"][: k + 2][mask], plain["pair_ids"])
    assert torch.all(padded["pair_ids"][k + 2 :] == -1) and torch.all(padded["prefix_segment"][k + 2 :] == -1)
    pre = padded["prefix_segment"][: k + 2]
    cu = padded["cu_seqlens"]
    for s in torch.nonzero(pre >= 0).flatten().tolist():  # each completion still names its prompt, in the same row
        p = int(pre[s])
        assert padded["pair_ids"][p] == padded["pair_ids"][s]
        assert (cu[p] // (SIZE + 16)) == (cu[s] // (SIZE + 16))
    whole = PackedCollator(flatten=True, seq_idx=True)(PackedDataset(stores[False], size=SIZE).__getitems__([0, 1]))
    assert whole["seq_idx"].shape == whole["input_ids"].shape  # [chosen][rejected]: two sequences, two indices
    with pytest.raises(ConfigError, match="seq_idx cannot describe a shared-prompt preference batch"):
        PackedCollator(seq_idx=True)(ds.__getitems__([0]))


def test_hf_keys_carry_what_the_door_and_the_loss_read(stores):
    for share in (False, True):
        ds = PackedDataset(stores[share], size=SIZE)
        batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
        want = set(HF_KEYS) | {"pair_ids", "chosen"} | ({"prefix_segment"} if share else set())
        assert set(batch) == want
    only_ids = PackedCollator(keys=("input_ids",))(PackedDataset(stores[True], size=SIZE).__getitems__([0]))
    assert set(only_ids) == {"input_ids", "prefix_segment"}  # a shared batch never loses its prompt links


def test_context_parallel_is_refused_for_a_shared_prompt_batch(stores):
    ds = PackedDataset(stores[True], size=SIZE)
    with pytest.raises(ConfigError, match="shared-prompt preference batch cannot be split for context parallelism"):
        PackedCollator(cp_size=2)(ds.__getitems__([0]))


def test_dataloader_batches_and_a_plain_store_has_no_pair_keys(stores, tmp_path):
    loader = DataLoader(PackedDataset(stores[True], size=SIZE), batch_size=4, collate_fn=PackedCollator(flatten=True))
    batches = list(loader)
    assert sum(int((b["prefix_segment"] >= 0).sum()) for b in batches) > 0
    pairs = torch.cat([b["pair_ids"][b["chosen"]] for b in batches])
    assert pairs.unique().numel() == pairs.numel()  # every chosen sequence once over the epoch
    plain = make_store(tmp_path / "plain", np.array([30, 40, 50]), with_loss=True)
    pack_store(PackConfig(plain, 128, tmp_path / "p"))
    ds = PackedDataset(tmp_path / "p", size=128)
    assert not ds.preference and "pair_ids" not in ds[0]
    assert "pair_ids" not in PackedCollator()(ds.__getitems__([0]))


def test_positions_of_a_shared_completion_continue_its_prompt(tmp_path):
    """A hand-made pair: prompt [5 6 7], chosen [8 9], rejected [10]: P 0..2, C 3..4, R 3."""
    p, c, r = np.array([5, 6, 7]), np.array([8, 9]), np.array([10])
    tok = write_pref_store(tmp_path / "tok", [(p, c, r)])
    pack_store(PackConfig(tok, 16, tmp_path / "o", share_prompt=True))
    item = PackedDataset(tmp_path / "o", size=16)[0]
    assert item["cu_seqlens"].tolist() == [0, 3, 5, 6, 16]
    assert item["input_ids"][:6].tolist() == [5, 6, 7, 8, 9, 10]
    assert item["position_ids"][:6].tolist() == [0, 1, 2, 3, 4, 3]
    # labels keep each completion's first token: it is predicted by the prompt's last token
    assert item["labels"][:6].tolist() == [-100, -100, -100, 8, 9, 10]
    assert item["pair_ids"].tolist() == [0, 0, 0, -1]
    assert item["chosen"].tolist() == [False, True, False, False]
    assert item["prefix_segment"].tolist() == [-1, 0, 0, -1]
    assert item["n_target_tokens"] == 3
