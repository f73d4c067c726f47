"""Packing documents with images: image spans never cut, `--vision-budget` respected by every algorithm,
text-only packing unchanged, the image CSR verified, `stats` reporting images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from support import cli, cli_error, make_store
from vision_support import IMG, VEND, VSTART, Doc, info, make_vision_store, png, random_docs

from packtool.choices import Algorithm, Overlong
from packtool.core.packing import ALGORITHMS, pack_lengths
from packtool.core.packing.budget import pack_with_budget
from packtool.core.packing.vision_segments import ImageSpans, build_vision_segments
from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import open_pack_split
from packtool.formats.token_store import open_token_store
from packtool.stages.pack import PackConfig, pack_store
from packtool.stages.verify import VerifyConfig, verify_path


def spans(doc: list[int], offset: list[int], ntok: list[int], patches: list[int] | None = None) -> ImageSpans:
    a = [np.asarray(x, np.int64) for x in (doc, offset, ntok, patches or [4 * n for n in ntok])]
    return ImageSpans(*a, np.arange(len(doc), dtype=np.int64))


def test_cut_moves_back_to_the_image_start() -> None:
    # one document of 30 tokens: images at 8..13 (markers 7 and 14) and 20..21 (markers 19, 22), cap 10
    img = spans([0, 0], [8, 20], [6, 2])
    v = build_vision_segments(np.array([100]), np.array([30]), img, 10, Overlong.SPLIT)
    s = v.segments
    assert s.real.tolist() == [7, 10, 10, 3]  # 0..7 | 7..17 (marker, image, marker, text) | 17..27 | 27..30
    assert v.at.tolist() == [0, 7, 17, 27] and s.src.tolist() == [100, 107, 117, 127]
    assert v.count.tolist() == [0, 1, 1, 0] and v.first.tolist() == [0, 0, 1, 2]
    assert v.patches.tolist() == [0, 24, 8, 0]
    t = build_vision_segments(np.array([0]), np.array([30]), img, 10, Overlong.TRUNCATE)
    assert t.segments.real.tolist() == [7] and t.n_dropped_images == 2 and t.segments.n_dropped_tokens == 23
    d = build_vision_segments(np.array([0, 30]), np.array([30, 5]), img, 10, Overlong.DROP)
    assert d.segments.doc.tolist() == [1] and d.n_dropped_images == 2
    with pytest.raises(ConfigError, match="document 0 has 30 tokens"):
        build_vision_segments(np.array([0]), np.array([30]), img, 10, Overlong.ERROR)


def test_adjacent_images_stay_together_and_an_image_too_long_is_refused() -> None:
    # two images with no separator (LLaVA-like): 4..9 and 10..15; a cut at 12 moves before both
    img = spans([0, 0], [4, 10], [6, 6])
    v = build_vision_segments(np.array([0]), np.array([20]), img, 14, Overlong.SPLIT)
    assert v.segments.real.tolist() == [3, 14, 3] and v.count.tolist() == [0, 2, 0]
    big = spans([0], [2], [12])
    with pytest.raises(ConfigError, match=r"an image of 12 tokens .*never cut.*--overlong drop"):
        build_vision_segments(np.array([0]), np.array([20]), big, 10, Overlong.SPLIT)
    assert len(build_vision_segments(np.array([0]), np.array([20]), big, 10, Overlong.DROP).segments) == 0


def test_budget_splits_documents_and_refuses_an_image_over_it() -> None:
    img = spans([0, 0, 0], [2, 6, 10], [2, 2, 2], [30, 30, 30])
    v = build_vision_segments(np.array([0]), np.array([16]), img, 100, Overlong.SPLIT, budget=64)
    assert v.patches.tolist() == [60, 30] and v.segments.real.tolist() == [9, 7]
    with pytest.raises(ConfigError, match="document 0 has 90 vision patches, more than --vision-budget 64"):
        build_vision_segments(np.array([0]), np.array([16]), img, 100, Overlong.ERROR, budget=64)
    with pytest.raises(ConfigError, match="image of 30 vision patches, more than --vision-budget 20"):
        build_vision_segments(np.array([0]), np.array([16]), img, 100, Overlong.SPLIT, budget=20)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_two_capacities_every_algorithm(algorithm: str) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 400, 3000)
    patches = np.where(rng.random(3000) < 0.4, rng.integers(16, 1200, 3000), 0)
    for shuffle in (True, False):  # a budget that never binds: pack_lengths' result exactly
        plain = pack_lengths(lengths, 1024, algorithm, seed=5, shuffle=shuffle, max_items_per_pack=7)
        same = pack_with_budget(lengths, patches, 1024, 10**9, algorithm, seed=5, shuffle=shuffle, max_items_per_pack=7)
        assert all(np.array_equal(a, b) for a, b in zip(plain, same, strict=True))
    offsets, order = pack_with_budget(lengths, patches, 1024, 2048, algorithm, seed=5, max_items_per_pack=7)
    assert sorted(order.tolist()) == list(range(3000))
    pack = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    assert np.bincount(pack, lengths[order]).max() <= 1024
    assert np.bincount(pack, patches[order]).max() <= 2048
    assert np.diff(offsets).max() <= 7


def test_pack_verify_and_stats_of_a_vision_store(tmp_path: Path) -> None:
    store = make_vision_store(tmp_path / "s", random_docs(300, seed=11, max_text=90))
    out = tmp_path / "p"
    code, stdout, _ = cli("pack", str(store), "--size", "128", "--output", str(out), "--vision-budget", "48")
    assert code == 0, stdout
    pack_dir = next((out / "packed").iterdir())
    ps = open_pack_split(pack_dir, "training", 128)
    meta = ps.metadata["vision"]
    assert meta["budget"] == 48 and 0 < meta["max_pack_patches"] <= 48 and meta["n_dropped_images"] == 0
    table = open_token_store(store).media
    assert table is not None and meta["n_images"] == len(table)
    report = verify_path(VerifyConfig(out, source=store))
    assert "images whole in their packs" in report.checked[0] and "each where its document is" in report.checked[0]
    code, text, _ = cli("stats", str(out), "--json")
    assert code == 0
    v = json.loads(text)["vision"]
    assert v["n_images"] == len(table) and v["patches_per_pack"]["max"] <= 48 and v["images_per_pack"]["mean"] > 0
    code, text, _ = cli("stats", str(store), "--size", "128")
    assert code == 0 and "image tokens" in text and "images per document" in text


def test_image_spans_whole_in_split_documents(tmp_path: Path) -> None:
    """Long documents with many images, split at text only: every image whole where verify looks."""
    data = [png(28 * (1 + i % 3), 56, i) for i in range(4)]
    rng = np.random.default_rng(2)
    docs = []
    for k in range(40):
        parts, at = [rng.integers(2, 590, 5)], []
        for j in range(int(rng.integers(3, 9))):
            img = data[(k + j) % 4]
            ntok = info(img)[0]
            at.append((sum(p.size for p in parts) + 1, img))
            parts += [
                np.array([VSTART]),
                np.full(ntok, IMG),
                np.array([VEND]),
                rng.integers(2, 590, int(rng.integers(0, 9))),
            ]
        docs.append(Doc(np.concatenate(parts), at))
    store = make_vision_store(tmp_path / "s", docs)
    for overlong in ("split", "truncate"):
        out = tmp_path / overlong
        res = pack_store(PackConfig(store, 24, out, overlong=Overlong(overlong), algorithm=Algorithm.FFD))
        assert res.metadata["overlong"]["count"] > 0
        report = verify_path(VerifyConfig(out, source=store))
        assert "each where its document is" in report.checked[0]
    split = open_pack_split(res.directory.parent / res.directory.name, "training", 24)
    assert split.images is not None


def test_vision_budget_refused_on_a_text_store(tmp_path: Path) -> None:
    store = make_store(tmp_path / "t", np.array([5, 9, 3]))
    err = cli_error("pack", str(store), "--size", "16", "--output", str(tmp_path / "p"), "--vision-budget", "8", code=2)
    assert "holds no images" in err
    err = cli_error("pack", str(store), "--size", "16", "--output", str(tmp_path / "p"), "--vision-budget", "0", code=2)
    assert "--vision-budget must be an integer >= 1" in err


def test_text_only_pack_bytes_unchanged(tmp_path: Path) -> None:
    """The vision path never touches a text store: its build files hash as before (pack is deterministic)."""
    store = make_store(tmp_path / "t", np.random.default_rng(0).integers(1, 60, 200))
    a = pack_store(PackConfig(store, 64, tmp_path / "a")).metadata
    assert "vision" not in a and not any("img" in name for name in a["files"])


def test_verify_catches_a_misplaced_image(tmp_path: Path) -> None:
    store = make_vision_store(tmp_path / "s", random_docs(60, seed=12, p_image=1.0))
    out = tmp_path / "p"
    res = pack_store(PackConfig(store, 128, out))
    ps = open_pack_split(res.directory, "training", 128)
    name = res.directory / ps.file_name("img_row")
    rows = np.load(name)
    rows[[0, 1]] = rows[[1, 0]]
    meta_files = ps.metadata["files"]
    np.save(name, rows)
    # the hash check catches it first; with the record updated, the image check must catch it on its own
    with pytest.raises(FormatError, match="img_row"):
        verify_path(VerifyConfig(out, source=store))
    from packtool.formats.files import sha256_file
    from packtool.formats.pack_store import metadata_name

    meta = dict(ps.metadata)
    meta_files[name.name]["sha256"] = sha256_file(name)
    (res.directory / metadata_name(128)).write_text(json.dumps(meta) + "\n")
    with pytest.raises(FormatError, match=r"first difference at image 0.*img_row"):
        verify_path(VerifyConfig(out, source=store))


def test_mixture_of_vision_stores_with_validation(tmp_path: Path) -> None:
    """Two image stores with weights and a validation split: images numbered over the sources, verified where
    their documents are, and the loader finds each one's bytes in the right store."""
    from vision_support import PROCESSOR_CONFIG

    from packtool.loader import PackedDataset
    from packtool.vision import VisionProcessor

    docs_a, docs_b = random_docs(40, seed=31), random_docs(30, seed=32, pool=3)
    a, b = make_vision_store(tmp_path / "a", docs_a), make_vision_store(tmp_path / "b", docs_b)
    out = tmp_path / "p"
    code, text, err = cli("pack", f"{a}:1", f"{b}:1.5", "--size", "160", "--output", str(out), "--validation", "0.2")
    assert code == 0, err
    report = verify_path(VerifyConfig(out, source=(a, b)))
    assert all("each where its document is" in line for line in report.checked)
    proc = VisionProcessor.from_config(PROCESSOR_CONFIG)
    store_docs = docs_a + docs_b
    for split in ("training", "validation"):
        ds = PackedDataset(out, split=split, size=160)
        ps = ds._open()
        po = np.asarray(ps.pack_offsets)
        for p in range(min(len(ds), 6)):
            want = []
            for j in range(int(po[p]), int(po[p + 1])):
                d = int(ps.seg_doc[j])
                start = int(np.sum([x.ids.size for x in store_docs[:d]]))
                at = int(ps.seg_src[j]) - start
                want += [data for off, data in store_docs[d].images if at <= off < at + int(ps.seg_lens[j])]
            assert torch.equal(ds[p]["pixel_values"], torch.from_numpy(proc.pixel_rows(want)[0]))


def test_run_config_vision_budget(tmp_path: Path) -> None:
    """`vision_budget:` under `pack:` in `packtool run` (a PackConfig field like every flag), then stats/verify."""
    store = make_vision_store(tmp_path / "s", random_docs(80, seed=41, max_text=90))
    (tmp_path / "run.yaml").write_text(
        f"pack: {{tokens_dir: {store}, size: 128, output: p, vision-budget: 40}}\nverify: {{source: {store}}}\n"
    )
    code, out, err = cli("run", str(tmp_path / "run.yaml"))
    assert code == 0, err
    line = open_pack_split(next((tmp_path / "p" / "packed").iterdir()), "training", 128).metadata["vision"]
    assert line["budget"] == 40 and line["max_pack_patches"] <= 40


def test_export_of_an_image_split_is_refused(tmp_path: Path) -> None:
    store = make_vision_store(tmp_path / "s", random_docs(20, seed=42))
    pack_store(PackConfig(store, 128, tmp_path / "p"))
    err = cli_error("export", str(tmp_path / "p"), "--to", "trl", "--output", str(tmp_path / "e"), code=1)
    assert "holds images" in err and not (tmp_path / "e").exists()
