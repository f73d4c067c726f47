"""Issue 39, a hostile pass: hub datasets, pair_scores and the prefetcher as a user and a reviewer meet them.

Each test here failed on the code before the fix its commit carries (see `git log`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_loopback import Hub, loopback_hub
from test_hub_datasets import TEST, TRAIN, Run, python

pytest.importorskip("huggingface_hub")


@pytest.fixture
def hub() -> Iterator[Hub]:
    with loopback_hub(lifetime=300) as state:
        yield state


@pytest.fixture
def run(tmp_path: Path, hub: Hub, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    return Run(tmp_path, hub, bpe_tokenizer_dir, monkeypatch)


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_card_data_files_are_read_in_the_cards_order_as_load_dataset_reads_them(hub: Hub, run: Run) -> None:
    """`path: [zz.jsonl, aa.jsonl]`: datasets reads zz then aa (pattern order), never the sorted order."""
    card = b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: [zz.jsonl, aa.jsonl]\n---\n"
    hub.dataset("acme/ordered", {"README.md": card, "zz.jsonl": jsonl(TRAIN[:5]), "aa.jsonl": jsonl(TRAIN[5:9])}, "main")
    assert run.ok("hf://datasets/acme/ordered", "o") == run.local(TRAIN[:9], "ref")


def test_a_split_of_several_keywords_is_read_in_datasets_keyword_order(hub: Hub, run: Run) -> None:
    """test.jsonl and eval.jsonl are both the test split: datasets reads `test` before `eval` (its keyword order)."""
    hub.dataset("acme/kw", {"train.jsonl": jsonl(TRAIN[:3]), "eval.jsonl": jsonl(TEST[:3]),
                            "test.jsonl": jsonl(TEST[3:])}, "main")  # fmt: skip
    assert run.ok("hf://datasets/acme/kw", "k", "--split", "test") == run.local(TEST[3:] + TEST[:3], "ref")


def test_a_cache_that_hf_filled_in_part_is_completed_not_read_as_the_split(tmp_path: Path, hub: Hub, run: Run) -> None:
    """`hf download` (or hf_hub_download) fetched one of the split's two files: packtool has no listing of the
    repo, so online it asks the hub and fetches the other, never tokenizes half the split."""
    hub.dataset("acme/two", {"data/train/a.jsonl": jsonl(TRAIN[:5]), "data/train/b.jsonl": jsonl(TRAIN[5:9])}, "main")
    python(tmp_path, hub, "import huggingface_hub as h\n"
                          "h.hf_hub_download('acme/two', 'data/train/a.jsonl', repo_type='dataset')")  # fmt: skip
    hub.requests.clear()
    assert run.ok("hf://datasets/acme/two", "p") == run.local(TRAIN[:9], "ref")
    assert hub.fetched() == ["data/train/b.jsonl"]
    hub.requests.clear()  # now packtool knows the listing: the cache alone, offline or not
    assert run.ok("hf://datasets/acme/two", "p2") == run.local(TRAIN[:9], "ref2") and hub.requests == []


def test_a_directory_that_hf_filled_in_part_is_completed_not_read_whole(tmp_path: Path, hub: Hub, run: Run) -> None:
    """`hf://datasets/ORG/NAME/DIR` over a snapshot `hf download --include` filled in part: online the hub's
    listing is asked and the rest fetched; a snapshot packtool filled (its listing kept) is read as is."""
    hub.dataset("acme/dir", {"data/train/a.jsonl": jsonl(TRAIN[:5]), "data/train/b.jsonl": jsonl(TRAIN[5:9])}, "main")
    python(tmp_path, hub, "import huggingface_hub as h\n"
                          "h.hf_hub_download('acme/dir', 'data/train/a.jsonl', repo_type='dataset')")  # fmt: skip
    hub.requests.clear()
    assert run.ok("hf://datasets/acme/dir/data/train", "p") == run.local(TRAIN[:9], "ref")
    assert hub.fetched() == ["data/train/b.jsonl"]
    hub.requests.clear()
    assert run.ok("hf://datasets/acme/dir/data/train/*.jsonl", "p2") == run.local(TRAIN[:9], "ref2")
    assert hub.requests == []


# ---- pair_scores on real packs ----


def _pref_packs(tmp_path: Path, pad_multiple: int, shared: bool = False):
    import numpy as np
    from preference_support import write_pref_store

    from packtool.loader import PackedCollator, PackedDataset
    from packtool.stages.pack import PackConfig, pack_store

    rng = np.random.default_rng(0)
    pairs = [tuple(rng.integers(5, 60, int(rng.integers(lo, hi))) for lo, hi in ((3, 7), (1, 5), (1, 5)))
             for _ in range(7)]  # fmt: skip
    store = write_pref_store(tmp_path / "store", pairs, vocab=64)
    out = tmp_path / f"packs{pad_multiple}{shared}"
    pack_store(PackConfig(store, 40, out, share_prompt=shared, pad_multiple=pad_multiple, shuffle=False))
    ds = PackedDataset(out)
    return pairs, PackedCollator()([ds[i] for i in range(len(ds))])


@pytest.mark.parametrize("pad_multiple", [1, 8])
def test_pair_scores_read_each_sequences_last_real_token_under_pad_multiple(tmp_path: Path, pad_multiple: int) -> None:
    """--pad-multiple pads every segment: the sequence's last token is before its padding (cu_seqlens_q holds the
    real offsets), and its length (TRL's attention_mask count) leaves the padding out. Several packs, [B, N] rows."""
    import torch

    from packtool.loss import pair_scores

    pairs, b = _pref_packs(tmp_path, pad_multiple)
    assert b["input_ids"].shape[0] > 1  # several packs in one batch, rows unflattened
    flat_ids = b["input_ids"].reshape(-1)
    scores = torch.arange(flat_ids.numel(), dtype=torch.float64).reshape(*b["input_ids"].shape, 1)
    got = pair_scores(scores, b)
    order = got.pair_ids.tolist()
    assert flat_ids[got.chosen_position].tolist() == [int(pairs[i][1][-1]) for i in order]
    assert flat_ids[got.rejected_position].tolist() == [int(pairs[i][2][-1]) for i in order]
    assert got.chosen_tokens.tolist() == [pairs[i][0].size + pairs[i][1].size for i in order]
    assert got.rejected_tokens.tolist() == [pairs[i][0].size + pairs[i][2].size for i in order]
    assert torch.equal(got.chosen, got.chosen_position.double())


# ---- DevicePrefetcher ----


def test_a_batchencoding_or_batchfeature_batch_is_copied_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' collators (DataCollatorWithPadding, processors) return BatchEncoding / BatchFeature, which are
    UserDicts, not dicts: their tensors must be copied and record_stream-ed too, never handed on left on the host."""
    import torch
    from test_prefetch import FakeOps
    from transformers import BatchEncoding, BatchFeature

    from packtool.loader import DevicePrefetcher
    from packtool.loader import prefetch as prefetch_module

    ops = FakeOps()
    monkeypatch.setattr(prefetch_module, "_device_ops", lambda device: None if device.type == "cpu" else ops)
    batches = [BatchEncoding({"input_ids": torch.arange(6).reshape(2, 3), "attention_mask": torch.ones(2, 3)}),
               BatchFeature({"pixel_values": torch.rand(1, 3, 4, 4), "image_sizes": [(4, 4)]})]  # fmt: skip
    got = list(DevicePrefetcher(batches, "cuda"))
    assert [type(b) for b in got] == [BatchEncoding, BatchFeature]
    for src, out in zip(batches, got, strict=True):
        for key, value in src.items():
            if isinstance(value, torch.Tensor):
                assert id(out[key]) in ops.copied and ops.copied[id(out[key])] is value, key
                assert torch.equal(out[key], value)
        assert out is not src and src["image_sizes" if "image_sizes" in src else "input_ids"] is not None
    assert len(ops.recorded) == 3  # every copied tensor is recorded on the consumer's stream
    assert got[1]["image_sizes"] == [(4, 4)]


def test_pair_scores_refuse_padding_whose_offsets_were_left_out(tmp_path: Path) -> None:
    """`PackedCollator(keys=HF_KEYS)` drops cu_seqlens_q / cu_seqlens_q_padded: a --pad-multiple batch then looks
    unpadded, and without pad_token_id the padding would be read as each sequence's last token. Refused by name;
    with pad_token_id (the pack's pad id) the rightmost non-pad token is read, as the model pools."""
    import torch

    from packtool.errors import FormatError
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset
    from packtool.loss import pair_scores

    pairs, _ = _pref_packs(tmp_path, 8)
    ds = PackedDataset(tmp_path / "packs8False")
    b = PackedCollator(flatten=True, keys=HF_KEYS)([ds[i] for i in range(len(ds))])
    scores = torch.arange(b["input_ids"].numel(), dtype=torch.float64)[None]
    # refused with or without pad_token_id: a pad id that is not the pack store's would read its padding silently
    for pad in (None, ds.pad_id):
        with pytest.raises(FormatError, match=r"ends on an unlabelled token.*cu_seqlens_unpadded.*cu_seqlens_q"):
            pair_scores(scores, b, pad_token_id=pad)
    full = PackedCollator(flatten=True)([ds[i] for i in range(len(ds))])  # its offsets kept: read exactly
    got = pair_scores(scores, full)
    ids = full["input_ids"].reshape(-1)
    assert ids[got.chosen_position].tolist() == [int(pairs[i][1][-1]) for i in got.pair_ids.tolist()]
