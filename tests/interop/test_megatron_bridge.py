"""Megatron-Bridge 0.6.2 reads `--to megatron-bridge` (Parquet) and `--to nemo` (legacy .npy) with its own code.

For every pack of every store, in batches of 4, its `collate_fn` output (tokens, labels, loss_mask,
position_ids, cu_seqlens_q/kv, max_seqlen_q) must equal what packtool's loader implies in Megatron's
convention: each sequence [s, e) of the loader's row gives inputs ids[s:e-1], labels ids[s+1:e] and
loss where the loader's label at t+1 is a target; the row is padded with EOS to the batch length
(rounded to 16) and the padding is one more cu_seqlens entry. Also run with Megatron-Bridge's static
shapes (`pad_cu_seqlens=True`), which read the exported `{N}_metadata.jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _megatron import EosTokenizer, dataset_kwargs, import_megatron_bridge_packing
from _stores import batches, build_stores, export, segments_per_pack

pytestmark = pytest.mark.interop

pytest.importorskip("pyarrow")
try:
    ParquetDataset, NpyDataset = import_megatron_bridge_packing()
except ImportError as exc:  # pragma: no cover - only outside `make interop`
    pytest.skip(f"megatron-bridge not importable: {exc}", allow_module_level=True)

from packtool.loader import PackedDataset  # noqa: E402

STORES = ["chat", "prompt_completion", "text", "u32"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    return build_stores(tmp_path_factory.mktemp("mb_stores"))


def _expected(items, counts, eos: int, size: int, pad_to_max: bool, meta: dict | None) -> dict[str, torch.Tensor]:
    """Megatron's batch for these loader items, derived from the loader's view alone."""
    rows = []
    for item, n_seg in zip(items, counts, strict=True):
        ids, labels = item["input_ids"].numpy(), item["labels"].numpy()
        cu = item["cu_seqlens"].numpy()[: n_seg + 1]  # the real sequences (the tail is not exported)
        segs = list(zip(cu[:-1], cu[1:], strict=True))
        rows.append(
            {
                "tokens": np.concatenate([ids[s : e - 1] for s, e in segs]),
                "labels": np.concatenate([ids[s + 1 : e] for s, e in segs]),
                "loss": np.concatenate([labels[s + 1 : e] != -100 for s, e in segs]).astype(np.int64),
                "pos": np.concatenate([np.arange(e - s - 1) for s, e in segs]),
                "cu": [0, *np.cumsum([e - s - 1 for s, e in segs]).tolist()],
            }
        )
    longest = max(r["tokens"].size for r in rows)
    length = size if pad_to_max else min(size, -(-longest // 16) * 16)
    out: dict[str, list] = {k: [] for k in ("tokens", "labels", "loss_mask", "position_ids", "cu")}
    for r in rows:
        pad = length - r["tokens"].size
        out["tokens"].append(np.pad(r["tokens"], (0, pad), constant_values=eos))
        out["labels"].append(np.pad(r["labels"], (0, pad), constant_values=eos))
        out["loss_mask"].append(np.pad(r["loss"], (0, pad)))
        out["position_ids"].append(np.pad(r["pos"], (0, pad)))
        cu = r["cu"] + ([length] if r["cu"][-1] != length else [])
        if meta is not None:
            cu += [length] * (meta["max_samples_per_bin"] - len(cu) + 2)
        out["cu"].append(cu)
    width = max(len(c) for c in out["cu"])
    cus = torch.tensor([c + [c[-1]] * (width - len(c)) for c in out["cu"]], dtype=torch.int32)
    if meta is not None:
        max_seqlen = torch.full((len(rows),), max(meta["dataset_max_seqlen"], length - meta["min_packed_seqlen"]))
    else:
        max_seqlen = (cus[:, 1:] - cus[:, :-1]).max(dim=1, keepdim=True).values
    result = {k: torch.tensor(np.stack(v), dtype=torch.long) for k, v in out.items() if k != "cu"}
    return {**result, "cu_seqlens_q": cus, "max_seqlen_q": max_seqlen}


def _compare(dataset, store, meta: dict | None, pad_to_max: bool) -> int:
    packed = PackedDataset(store.pack_dir, size=store.size)
    counts = segments_per_pack(store)
    assert len(dataset) == len(packed) > 0
    compared = 0
    for idx in batches(len(packed), 4):
        got = dataset.collate_fn([dataset[i] for i in idx])
        items = [packed[i] for i in idx]
        want = _expected(items, counts[idx], store.eos_id, store.size, pad_to_max, meta)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert torch.equal(got[key], want[key]), (store.name, idx, key)
        assert torch.equal(got["cu_seqlens_q"], want["cu_seqlens_q"]), (store.name, idx)
        assert torch.equal(got["cu_seqlens_kv"], want["cu_seqlens_q"])
        assert torch.equal(got["max_seqlen_q"].to(torch.int64), want["max_seqlen_q"].to(torch.int64))
        # the same targets as the loader, none lost to Megatron's "no loss after an EOS input" rule
        assert int(got["loss_mask"].sum()) == sum(int(it["n_target_tokens"]) for it in items)
        compared += len(idx)
    return compared


@pytest.mark.parametrize("name", STORES)
def test_parquet_reader_and_collate_equal_packtool_loader(stores, tmp_path: Path, name: str) -> None:
    store = stores[name]
    out = export(store, "megatron-bridge", tmp_path / "mb")
    path = out / f"training_{store.size}.idx.parquet"
    ds = ParquetDataset(file_path=str(path), tokenizer=EosTokenizer(store.eos_id), **dataset_kwargs(store.size))
    assert _compare(ds, store, None, pad_to_max=False) == len(ds)
    for i in range(len(ds)):  # Megatron-Bridge's own row validator
        row = ds[i]
        ParquetDataset.validate_row(i, row["input_ids"], row["loss_mask"], row["seq_boundaries"][:-1])


@pytest.mark.parametrize("name", ["chat", "text"])
def test_parquet_static_shapes_read_the_exported_metadata(stores, tmp_path: Path, name: str) -> None:
    store = stores[name]
    out = export(store, "megatron-bridge", tmp_path / "mb")
    meta_path = out / f"{store.size}_metadata.jsonl"
    [meta] = json.loads(meta_path.read_text())  # a JSON array, as Megatron-Bridge writes it
    kwargs = {**dataset_kwargs(store.size), "pad_to_max_length": True}
    ds = ParquetDataset(
        file_path=str(out / f"training_{store.size}.idx.parquet"),
        tokenizer=EosTokenizer(store.eos_id),
        pad_cu_seqlens=True,
        pack_metadata_file_path=str(meta_path),
        **kwargs,
    )
    _compare(ds, store, meta, pad_to_max=True)


@pytest.mark.parametrize("name", STORES)
def test_legacy_npy_reader_and_collate_equal_packtool_loader(stores, tmp_path: Path, name: str) -> None:
    store = stores[name]
    out = export(store, "nemo", tmp_path / "nemo")
    ds = NpyDataset(
        file_path=str(out / f"training_{store.size}.npy"),
        tokenizer=EosTokenizer(store.eos_id),
        pack_metadata_file_path=str(out / f"{store.size}_metadata.jsonl"),
        **dataset_kwargs(store.size),
    )
    assert _compare(ds, store, None, pad_to_max=False) == len(ds)
