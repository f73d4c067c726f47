"""The media files of a vision token store (`packtool.formats.media`): written, read back, refused when
broken, resumed, merged from shards and verified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from vision_support import IMG, TOKENIZER, make_vision_store, random_docs, vision_key, write_docs

from packtool.errors import FormatError
from packtool.formats import media as media_mod
from packtool.formats.media import BLOBS, INDEX, MEDIA_FILES, ROWS, MediaTable, MediaWriter
from packtool.formats.token_resume import resume_token_store
from packtool.formats.token_store import MANIFEST, TokenStoreWriter, open_token_store
from packtool.stages.merge import merge_shards
from packtool.stages.verify import VerifyConfig, verify_path


def test_manifest_name_is_the_token_stores() -> None:
    assert media_mod._MANIFEST == MANIFEST


def test_round_trip_dedup_and_lookup(tmp_path: Path) -> None:
    docs = random_docs(40, seed=1, pool=3)
    store = open_token_store(make_vision_store(tmp_path / "s", docs), check_hashes=True)
    table = store.media
    assert table is not None and MediaTable.open(store.path) is not None
    expected = [(d, off, data) for d, doc in enumerate(docs) for off, data in doc.images]
    assert len(table) == len(expected)
    assert table.index.size == len({data for _, _, data in expected}) <= 3  # each unique image once
    assert [table.data(i) for i in range(len(table))] == [data for _, _, data in expected]
    assert table.doc.tolist() == [d for d, _, _ in expected]
    assert table.offset.tolist() == [o for _, o, _ in expected]
    v = store.manifest["vision"]
    assert v["n_images"] == len(expected) and v["n_unique"] == table.index.size
    assert v["n_image_tokens"] == int(np.count_nonzero(np.asarray(store.tokens) == IMG))
    assert v["n_patches"] == int(table.n_patches.sum()) == 4 * v["n_image_tokens"]
    assert list(store.manifest["files"])[-3:] == list(MEDIA_FILES)
    # of_documents: documents in the order given, offsets in order
    want = [i for d in (7, 2, 7) for i, (dd, _, _) in enumerate(expected) if dd == d]
    assert table.of_documents(np.array([7, 2, 7])).tolist() == want
    assert table.of_documents(np.zeros(0, np.int64)).size == 0


def test_text_only_store_has_no_media(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.mkdir()
    writer = TokenStoreWriter(path, np.dtype("<u2"))
    writer.append(np.arange(10), np.array([4, 6]))
    writer.finish({"tokenizer": dict(TOKENIZER)})
    assert open_token_store(path).media is None
    assert MediaTable.open(path) is None
    assert not any((path / n).exists() for n in MEDIA_FILES)


def test_standalone_media_writer_beside_the_store_writer(tmp_path: Path) -> None:
    """The contract's MediaWriter(directory) + close() also makes a valid store (counts from `vision(...)`)."""
    path = tmp_path / "s"
    path.mkdir()
    docs = random_docs(6, seed=2, p_image=1.0)
    writer = TokenStoreWriter(path, np.dtype("<u2"))
    media = MediaWriter(path)
    for d, doc in enumerate(docs):
        writer.append(doc.ids, np.array([doc.ids.size]))
        for off, data in doc.images:
            from vision_support import info

            ntok, grid, patches = info(data)
            media.add(d, off, ntok, grid, patches, data)
    records = media.close()
    vision = media.vision("fake_vl", {"family": "fake_vl"}, IMG)
    manifest = writer.finish({"tokenizer": dict(TOKENIZER), "vision": vision})
    assert {n: manifest["files"][n] for n in MEDIA_FILES} == records
    assert len(open_token_store(path, check_hashes=True).media or []) == vision["n_images"] > 0


def _rewrite_manifest(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    m = json.loads((path / MANIFEST).read_text())
    edit(m)
    (path / MANIFEST).write_text(json.dumps(m))


def test_vision_key_and_files_must_agree(tmp_path: Path) -> None:
    path = make_vision_store(tmp_path / "a", random_docs(5, seed=3, p_image=1.0))
    _rewrite_manifest(path, lambda m: m.pop("vision"))
    with pytest.raises(FormatError, match="records images.rows, images.index, images.bin but the manifest has no 'vision'"):
        open_token_store(path)
    path = make_vision_store(tmp_path / "b", random_docs(5, seed=3, p_image=1.0))
    _rewrite_manifest(path, lambda m: m["files"].pop(BLOBS))
    with pytest.raises(FormatError, match="claims images .* lacks images.bin"):
        open_token_store(path)
    path = make_vision_store(tmp_path / "c", random_docs(5, seed=3, p_image=1.0))
    _rewrite_manifest(path, lambda m: m["vision"].update(n_images="3"))
    with pytest.raises(FormatError, match="vision.n_images must be an integer"):
        open_token_store(path)
    path = make_vision_store(tmp_path / "d", random_docs(5, seed=3, p_image=1.0))
    _rewrite_manifest(path, lambda m: m["vision"].update(n_patches=m["vision"]["n_patches"] + 1))
    with pytest.raises(FormatError, match="vision.n_patches is .* but the media files hold"):
        _ = open_token_store(path).media


@pytest.mark.parametrize("name", [ROWS, INDEX, BLOBS])
def test_truncated_media_file_is_named(tmp_path: Path, name: str) -> None:
    path = make_vision_store(tmp_path / "s", random_docs(8, seed=4, p_image=1.0))
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[:-1])
    with pytest.raises(FormatError, match=name.replace(".", r"\.")):
        open_token_store(path)
    with pytest.raises(FormatError, match=name.replace(".", r"\.")):
        MediaTable.open(path)


def test_corrupt_rows_and_bytes_are_named(tmp_path: Path) -> None:
    path = make_vision_store(tmp_path / "s", random_docs(8, seed=5, p_image=1.0))
    rows = np.fromfile(path / ROWS, media_mod.ROW_DTYPE)
    rows["offset"][1] = 10**9  # outside its document (same size: only the hash and the structure catch it)
    rows.tofile(path / ROWS)
    with pytest.raises(FormatError, match=r"image row 1 .*images\.rows"):
        _ = open_token_store(path).media
    path = make_vision_store(tmp_path / "t", random_docs(8, seed=5, p_image=1.0))
    blob = bytearray((path / BLOBS).read_bytes())
    blob[100] ^= 0xFF
    (path / BLOBS).write_bytes(bytes(blob))
    with pytest.raises(FormatError, match=r"images\.bin sha256 differs"):
        open_token_store(path, check_hashes=True)
    table = open_token_store(path).media
    assert table is not None
    with pytest.raises(FormatError, match=r"does not match its sha256 .*images\.bin"):
        [table.data(i) for i in range(len(table))]
    with pytest.raises(FormatError, match=r"images\.bin"):
        verify_path(VerifyConfig(path))


def test_verify_token_store_with_images(tmp_path: Path) -> None:
    path = make_vision_store(tmp_path / "s", random_docs(20, seed=6))
    report = verify_path(VerifyConfig(path))
    assert "images (" in report.checked[0] and "image tokens" in report.checked[0]
    # an image token outside any image row is refused (the rows must account for every one)
    bad = random_docs(3, seed=7, p_image=1.0)
    bad[0].ids[0] = IMG
    with pytest.raises(FormatError, match="image token outside any image"):
        verify_path(VerifyConfig(make_vision_store(tmp_path / "b", bad)))
    # a row whose span is not the image token
    bad = random_docs(3, seed=7, p_image=1.0)
    off = bad[1].images[0][0]
    bad[1].ids[off] = 5
    bad[1].ids[0] = IMG  # keep the count equal: only the span check can catch it
    with pytest.raises(FormatError, match="spans a token that is not the image token"):
        verify_path(VerifyConfig(make_vision_store(tmp_path / "c", bad)))


def test_resume_keeps_the_media_marks(tmp_path: Path) -> None:
    docs = random_docs(12, seed=8)
    whole = make_vision_store(tmp_path / "whole", docs)
    path = tmp_path / "part"
    path.mkdir()
    writer = TokenStoreWriter(path, np.dtype("<u2"), with_media=True)
    write_docs(writer, docs[:5])
    marks = [writer.mark()]
    write_docs(writer, docs[5:8])  # written but never marked: dropped on resume
    writer.close()
    writer, kept = resume_token_store(path, np.dtype("<u2"), marks, with_loss=True, with_rejects=False, with_media=True)
    assert kept == 1 and writer.media is not None and writer.media.n_images == sum(len(d.images) for d in docs[:5])
    write_docs(writer, docs[5:])
    writer.finish({"packtool_version": "test", "tokenizer": dict(TOKENIZER), "vision": vision_key()})
    for name in [*MEDIA_FILES, MANIFEST]:
        assert (path / name).read_bytes() == (whole / name).read_bytes(), name


def _shard(path: Path, docs, index: int, count: int) -> Path:  # type: ignore[no-untyped-def]
    shard = {"index": index, "count": count, "chunk_start": index, "chunk_end": index + 1, "n_chunks": count, "build": "b"}
    sources = [{"path": "x", "records": len(docs), "documents": len(docs), "rejected": 0}]
    return make_vision_store(path, docs, {"sources": sources, "shard": shard})


def test_merge_concatenates_and_deduplicates_across_shards(tmp_path: Path) -> None:
    docs = random_docs(30, seed=9, pool=4)
    sources = [{"path": "x", "records": len(docs), "documents": len(docs), "rejected": 0}]
    whole = make_vision_store(tmp_path / "whole", docs, {"sources": sources})
    shards = [_shard(tmp_path / f"s{i}", docs[a:b], i, 3) for i, (a, b) in enumerate([(0, 9), (9, 20), (20, 30)])]
    out = merge_shards(shards, tmp_path / "merged").path
    for name in MEDIA_FILES:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    merged = json.loads((out / MANIFEST).read_text())
    assert merged.pop("build") == "b" and merged == json.loads((whole / MANIFEST).read_text())
    # a text-only shard beside image shards is refused
    plain = tmp_path / "plain"
    plain.mkdir()
    writer = TokenStoreWriter(plain, np.dtype("<u2"))
    writer.append(np.arange(5), np.array([5]))
    shard = {"index": 2, "count": 3, "chunk_start": 2, "chunk_end": 3, "n_chunks": 3, "build": "b"}
    writer.finish({"packtool_version": "test", "tokenizer": dict(TOKENIZER), "sources": sources, "shard": shard})
    from packtool.errors import ConfigError

    with pytest.raises(ConfigError, match="'vision'"):
        merge_shards([shards[0], shards[1], plain], tmp_path / "m2")
