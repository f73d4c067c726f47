"""Input expansion, deterministic chunking and record reading (file:line) for every input type."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import zipf_texts

from packtool.core.encoding.shapes.fields import get_field, get_text_field
from packtool.errors import InputError
from packtool.stages.tokenize.inputs.locators import expand_inputs
from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk


def _jsonl(path: Path, rows: list[object], blank_every: int = 0) -> Path:
    lines = []
    for i, row in enumerate(rows):
        lines.append(json.dumps(row))
        if blank_every and i % blank_every == 0:
            lines.append("   ")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_expand_sorted_recursive_glob_and_dedup(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    for name in ["d/b.jsonl", "d/sub/a.txt", "d/a.parquet", "c.jsonl.gz", "d/.hidden/x.jsonl", "d/notes.md"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    got = expand_inputs([str(tmp_path / "d"), str(tmp_path / "*.jsonl.gz"), str(tmp_path / "d" / "b.jsonl")])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == ["c.jsonl.gz", "d/a.parquet", "d/b.jsonl", "d/sub/a.txt"]


@pytest.mark.parametrize("bad", ["missing.jsonl", "nothing*.jsonl", "notes.md"])
def test_expand_rejects_missing_and_unsupported(tmp_path: Path, bad: str) -> None:
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(InputError, match=r"notes\.md|does not exist"):
        expand_inputs([str(tmp_path / bad)])


@pytest.mark.parametrize("chunk_bytes", [1, 50, 777, 4096, 1 << 30])
def test_jsonl_chunks_cover_the_file_at_line_starts_with_right_line_numbers(tmp_path: Path, chunk_bytes: int) -> None:
    texts = zipf_texts(300, seed=3)
    path = _jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts], blank_every=7)
    data = path.read_bytes()
    sources, chunks = plan_chunks([path], chunk_bytes)
    assert sources[0].n_bytes == len(data)
    assert chunks[0].start == 0 and chunks[-1].end == len(data)
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.end == b.start and data[b.start - 1 : b.start] == b"\n"
        assert b.first_line == data[: b.start].count(b"\n") + 1
    records = [r for c in chunks for r in read_chunk(c)]
    lines = data.decode().split("\n")
    assert [r.value["text"] for r in records] == texts
    assert all(json.loads(lines[r.line - 1]) == r.value for r in records)
    if chunk_bytes == 777:
        assert len(chunks) > 5  # really split, not one chunk


def test_line_longer_than_a_chunk_and_no_trailing_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"text": "x" * 5000}) + "\n" + json.dumps({"text": "y"}))
    _, chunks = plan_chunks([path], 100)
    records = [r for c in chunks for r in read_chunk(c)]
    assert [(r.line, len(r.value["text"])) for r in records] == [(1, 5000), (2, 1)]


def test_compressed_parquet_and_txt_read_the_same_records(tmp_path: Path) -> None:
    rows = [{"text": t, "meta": {"id": i}} for i, t in enumerate(zipf_texts(50, seed=4))]
    raw = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=7)
    sources, chunks = plan_chunks(expand_inputs([str(tmp_path)]), 200)
    by_kind: dict[str, list] = {}
    for chunk in chunks:
        by_kind.setdefault(chunk.kind, []).extend(read_chunk(chunk))
    assert len([c for c in chunks if c.kind == "parquet"]) > 1  # row groups became several chunks
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for kind in ("jsonl.gz", "jsonl.zst", "parquet"):
        assert [r.value for r in by_kind[kind]] == rows, kind
        assert [r.line for r in by_kind[kind]] == list(range(1, 51))


def test_txt_whole_file_and_separator_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\n---\nthree\n---\n")
    _, chunks = plan_chunks([path], 1 << 20)
    assert [r.value for r in read_chunk(chunks[0])] == ["one\ntwo\n\n---\nthree\n---\n"]
    got = [(r.line, r.value) for r in read_chunk(chunks[0], separator="---\n")]
    assert got == [(1, "one\ntwo\n\n"), (5, "three\n"), (7, "")]


def test_bad_bytes_become_error_records(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": \n{"text": "\xff\xfe"}\n')
    (tmp_path / "b.txt").write_bytes(b"fine\nbad \xff here\n")
    _, chunks = plan_chunks(expand_inputs([str(tmp_path)]), 1 << 20)
    records = [r for c in chunks for r in read_chunk(c)]
    assert [(Path(r.source).name, r.line, r.error) for r in records][1:] == [
        ("a.jsonl", 2, records[1].error), ("a.jsonl", 3, "invalid UTF-8"),
        ("b.txt", 2, "invalid UTF-8 (byte 0xff at byte 9 of the document; the file is not UTF-8 text: re-encode it as "
                     "UTF-8, e.g. iconv -f latin1 -t utf-8)")]
    assert records[1].error.startswith("malformed JSON")


def test_nested_fields() -> None:
    record = {"a": {"b": {"c": "deep"}}, "n": 3}
    assert get_text_field(record, "a.b.c") == ("deep", None)
    assert get_field(record, "a.b") == ({"c": "deep"}, None)
    assert "missing field 'a.x'" in str(get_text_field(record, "a.x")[1])
    assert "not a string" in str(get_text_field(record, "n")[1])
    assert "not an object" in str(get_text_field(record, "n.q")[1])


@pytest.mark.parametrize("sep", [b"\n", b"<doc>", b"\n\n"])
@pytest.mark.parametrize("block", [1, 3, 7, 64, 4096])
def test_split_records_equals_split_with_bounded_pieces(sep: bytes, block: int) -> None:
    from packtool.stages.tokenize.inputs.streams import TooLong, split_records

    rng = np.random.default_rng(block)
    alphabet = np.frombuffer(b"ab\nc<do>", np.uint8)
    pieces = [rng.choice(alphabet, size=int(n)).tobytes().replace(sep, b"") for n in rng.zipf(1.5, 200) % 300]
    data = sep.join(pieces)
    limit = 40
    blocks = iter([data[i : i + block] for i in range(0, len(data), block)])
    got = list(split_records(blocks, sep, limit))
    want = data.split(sep)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if len(w) > limit:
            assert g == TooLong(len(w), w.count(b"\n"))
        else:
            assert g == w


@pytest.mark.parametrize("settings", [
    {"write_checksum": True, "write_content_size": True},
    {"write_checksum": False, "write_content_size": False},
    {"write_checksum": True, "write_content_size": False, "level": 19},
])
def test_zstd_frame_check_passes_whole_files_and_every_cut_inside_a_frame(tmp_path: Path, settings: dict) -> None:
    from packtool.stages.tokenize.inputs.streams import check_zstd_frames

    raw = "".join(json.dumps({"text": t}) + "\n" for t in zipf_texts(400, seed=6)).encode()
    frames = [zstandard.ZstdCompressor(**settings).compress(raw[i::3]) for i in range(3)]
    if not settings["write_content_size"]:  # streamed frames: no content size, several blocks
        cobj = zstandard.ZstdCompressor(**settings).compressobj()
        frames[1] = cobj.compress(raw * 3) + cobj.flush()
    data = b"".join(frames)
    bounds = set(np.cumsum([0] + [len(f) for f in frames]).tolist())
    path = tmp_path / "a.jsonl.zst"
    for cut in sorted(set(range(0, len(data) + 1, 97)) | bounds | {len(data) - 1, len(data) - 3}):
        path.write_bytes(data[:cut])
        if cut in bounds:
            check_zstd_frames(str(path))
        else:
            with pytest.raises(InputError, match="truncated"):
                check_zstd_frames(str(path))
