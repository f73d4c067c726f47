"""OLMo-core 3.0 reads `--to olmo-core` exports with its own `NumpyFSLDataset`: instance i == pack i.

For every pack of every store tokenized with EOS (`text` is long documents packed with the default
`--overlong split`: head fragments without EOS, each alone in its pack, which OLMo-core ends at the
instance boundary): `input_ids` equal the loader's, `label_mask` equals the
loader's `labels != -100`, and `doc_lens` (found by EOS, `generate_doc_lengths=True`) equal the
loader's `cu_seqlens` differences, tail padding included. Then OLMo-core's `DataCollator` +
`get_labels` (mask, then shift) give the loader's labels shifted by one, and
`get_cumulative_document_lengths` the loader's global `cu_seqlens` for the flattened batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _stores import batches, build_stores, export

pytestmark = pytest.mark.interop

pytest.importorskip("olmo_core")
from olmo_core.data.collator import DataCollator  # noqa: E402
from olmo_core.data.numpy_dataset import NumpyFSLDataset  # noqa: E402
from olmo_core.data.utils import get_cumulative_document_lengths, get_labels  # noqa: E402

from packtool.loader import PackedCollator, PackedDataset  # noqa: E402

STORES = ["chat_eos", "prompt_completion", "text_eos", "u32", "text"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    return build_stores(tmp_path_factory.mktemp("olmo_stores"))


@pytest.mark.parametrize("name", STORES)
def test_numpy_fsl_dataset_equals_packtool_loader_for_every_pack(stores, tmp_path: Path, name: str) -> None:
    store = stores[name]
    out = export(store, "olmo-core", tmp_path / "olmo")
    packed = PackedDataset(store.pack_dir, size=store.size)
    dtype = np.uint16 if packed.metadata["dtype"] == "uint16" else np.uint32
    ds = NumpyFSLDataset(
        str(out / f"training_{store.size}.npy"),
        sequence_length=store.size,
        pad_token_id=store.pad_id,
        eos_token_id=store.eos_id,
        vocab_size=store.vocab_size,
        dtype=dtype,
        generate_doc_lengths=True,
        label_mask_paths=[str(out / f"training_{store.size}.label_mask.npy")],
    )
    ds.work_dir = tmp_path / "work"
    ds.prepare()
    assert len(ds) == len(packed) > 0
    for i in range(len(ds)):
        got, want = ds[i], packed[i]
        assert torch.equal(got["input_ids"], want["input_ids"]), (name, i)
        assert torch.equal(got["label_mask"], want["labels"] != -100), (name, i)
        assert torch.equal(got["doc_lens"].to(torch.int32), torch.diff(want["cu_seqlens"])), (name, i)

    collate = DataCollator(pad_token_id=store.pad_id, vocab_size=store.vocab_size)
    ours = PackedCollator()
    ours_flat = PackedCollator(flatten=True)
    for idx in batches(len(ds), 4):
        batch = collate([ds[i] for i in idx])
        want = ours(packed.__getitems__(idx))
        assert torch.equal(batch["input_ids"], want["input_ids"])
        shifted = F.pad(want["labels"][:, 1:], (0, 1), value=-100)
        assert torch.equal(get_labels(batch), shifted), (name, idx)
        cu = get_cumulative_document_lengths(batch["doc_lens"])
        assert torch.equal(cu, ours_flat(packed.__getitems__(idx))["cu_seqlens"]), (name, idx)


def test_default_split_store_has_fragments_without_eos_and_olmo_core_documents_match(stores, tmp_path: Path) -> None:
    """The case export used to refuse: OLMo-core's own EOS scan (`get_document_lengths`) on every pack of the
    default split store gives packtool's segments, fragments without EOS included."""
    from olmo_core.data.utils import get_document_lengths

    store = stores["text"]
    out = export(store, "olmo-core", tmp_path / "olmo")
    packed = PackedDataset(store.pack_dir, size=store.size)
    assert packed.metadata["overlong"]["policy"] == "split" and packed.metadata["overlong"]["count"] > 0
    dtype = np.uint16 if packed.metadata["dtype"] == "uint16" else np.uint32
    tokens = np.memmap(out / f"training_{store.size}.npy", dtype=dtype, mode="r").reshape(-1, store.size)
    fragments = 0
    for i in range(len(packed)):
        item = packed[i]
        cu = item["cu_seqlens"]
        last_tokens = item["input_ids"][cu[1:] - 1]
        fragments += int(((last_tokens != store.eos_id) & (last_tokens != store.pad_id)).sum())
        doc_lens = get_document_lengths(np.asarray(tokens[i]), store.eos_id)
        assert torch.equal(doc_lens.to(torch.int32), torch.diff(cu)), i
    assert fragments > 0
