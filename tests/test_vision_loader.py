"""`PackedDataset` / `PackedCollator` over a vision pack store: pixels, grids and M-RoPE positions exactly as
the family adapter gives them for each pack's images and each document alone; kept by `keys=HF_KEYS`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from vision_support import IMG, PROCESSOR_CONFIG, make_vision_store, random_docs

from packtool.errors import ConfigError, FormatError
from packtool.formats.token_store import open_token_store
from packtool.loader import PackedDataset
from packtool.loader.collator import HF_KEYS, PackedCollator
from packtool.stages.pack import PackConfig, pack_store
from packtool.vision import VisionProcessor

SIZE = 160


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:  # type: ignore[type-arg]
    tmp = tmp_path_factory.mktemp("vl")
    docs = random_docs(60, seed=21, max_text=70)
    store = make_vision_store(tmp / "s", docs)
    res = pack_store(PackConfig(store, SIZE, tmp / "p", max_docs_per_pack=4))
    return store, res.directory, docs


def expected_pack(ds: PackedDataset, store_dir: Path, docs: list, p: int) -> tuple[list[bytes], list[tuple[int, int, np.ndarray]]]:  # type: ignore[type-arg]
    """The images of pack p from the SOURCE documents (not the image CSR): each segment's document images inside
    its tokens, in row order; and (row start, length, document ids) per segment."""
    store = open_token_store(store_dir)
    ps = ds._open()
    po = np.asarray(ps.pack_offsets)
    images, segs, col = [], [], 0
    for j in range(int(po[p]), int(po[p + 1])):
        d, src, n = int(ps.seg_doc[j]), int(ps.seg_src[j]), int(ps.seg_lens[j])
        at = src - int(store.starts[d])
        images += [data for off, data in docs[d].images if at <= off < at + n]
        segs.append((col, n, np.asarray(store.tokens[src : src + n], np.int64)))
        col += n
    return images, segs


def test_items_carry_the_processors_pixels_grids_and_positions(packed) -> None:  # type: ignore[no-untyped-def]
    store, directory, docs = packed
    ds = PackedDataset(directory, size=SIZE)
    assert ds.vision
    proc = VisionProcessor.from_config(PROCESSOR_CONFIG)
    n_with_images = 0
    for p in range(len(ds)):
        item = ds[p]
        images, segs = expected_pack(ds, store, docs, p)
        pixels, grids = proc.pixel_rows(images)
        assert torch.equal(item["pixel_values"], torch.from_numpy(pixels))
        assert item["image_grid_thw"].tolist() == grids.tolist()
        pos = item["position_ids"]
        assert pos.shape == (4, SIZE) and pos.dtype == torch.int64
        g = 0
        for col, n, ids in segs:
            assert item["input_ids"][col : col + n].tolist() == ids.tolist()
            k = int(np.count_nonzero(np.diff(np.concatenate([[0], (ids == IMG).astype(int)])) == 1))
            alone = proc.rope_positions(ids, grids[g : g + k])  # the document (segment) alone
            g += k
            assert pos[0, col : col + n].tolist() == list(range(n))  # text positions restart per segment
            assert pos[1:, col : col + n].tolist() == alone.tolist()
        end = sum(n for _, n, _ in segs)
        assert (pos[1:, end:] == 1).all()  # padding as transformers pads
        n_with_images += bool(images)
    assert n_with_images > 3


def test_collator_flattens_and_keeps_the_vision_keys(packed) -> None:  # type: ignore[no-untyped-def]
    _, directory, _ = packed
    ds = PackedDataset(directory, size=SIZE)
    idx = [0, 3, 5]
    items = [ds[i] for i in idx]
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__(idx))
    assert set(batch) == {*HF_KEYS, "pixel_values", "image_grid_thw"}
    total = SIZE * len(idx)
    assert batch["input_ids"].shape == (1, total) and batch["position_ids"].shape == (4, 1, total)
    assert torch.equal(batch["position_ids"][:, 0], torch.cat([it["position_ids"] for it in items], 1))
    assert torch.equal(batch["pixel_values"], torch.cat([it["pixel_values"] for it in items]))
    assert torch.equal(batch["image_grid_thw"], torch.cat([it["image_grid_thw"] for it in items]))
    # items collated one by one (any collate path) give the same batch
    again = PackedCollator(flatten=True, keys=HF_KEYS)(items)
    assert all(torch.equal(batch[k], again[k]) for k in batch if isinstance(batch[k], torch.Tensor))
    rows = PackedCollator()(ds.__getitems__(idx))
    assert rows["position_ids"].shape == (4, 3, SIZE)
    with pytest.raises(ConfigError, match="pad_to_length is not supported for a batch with images"):
        PackedCollator(pad_to_length=4 * SIZE)(ds.__getitems__(idx))


def test_dataloader_workers_give_the_same_batches(packed) -> None:  # type: ignore[no-untyped-def]
    _, directory, _ = packed
    ds = PackedDataset(directory, size=SIZE)
    collate = PackedCollator(flatten=True, keys=HF_KEYS)
    here = [collate(ds.__getitems__([i, i + 1])) for i in range(0, 6, 2)]
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate)
    for a, b in zip(here, list(loader)[:3], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_moved_or_replaced_source_is_refused(packed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    store, directory, _ = packed
    other = make_vision_store(tmp_path / "o", random_docs(5, seed=3))
    with pytest.raises(FormatError, match="not the token store these packs were made from"):
        PackedDataset(directory, size=SIZE, sources=[other])
    with pytest.raises(FormatError, match="cannot be read .*PackedDataset\\(sources="):
        PackedDataset(directory, size=SIZE, sources=[tmp_path / "nowhere"])
    assert PackedDataset(directory, size=SIZE, sources=[store]).vision


def test_document_dataset_refuses_a_store_with_images(packed) -> None:  # type: ignore[no-untyped-def]
    from packtool.loader import DocumentDataset

    store, _, _ = packed
    with pytest.raises(ConfigError, match="holds images, DocumentDataset"):
        DocumentDataset(store)


def test_a_batch_without_images_has_no_pixel_keys(tmp_path: Path) -> None:
    """transformers' Qwen2-VL fails on pixel_values of 0 rows: a batch of packs without images leaves them out
    (positions stay [4, 1, T])."""
    store = make_vision_store(tmp_path / "s", random_docs(10, seed=1, p_image=0.0))
    res = pack_store(PackConfig(store, 64, tmp_path / "p"))
    ds = PackedDataset(res.directory, size=64)
    assert ds[0]["pixel_values"].shape[0] == 0
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
    assert "pixel_values" not in batch and "image_grid_thw" not in batch and batch["position_ids"].shape == (4, 1, 128)
