"""The input readers' registry and contract (`packtool/stages/tokenize/inputs/readers/`).

The guard: every module in `readers/` is registered, every kind reaches its reader by name, and
everything derived from the registry (the CLI help of INPUT, the error texts, the hub file families)
covers every reader. The contract: `check_reader` runs over a file of every kind (a new reader's test
calls it too): the same records for any `chunk_bytes`, numbered as the reader says, deterministic
plans, over-long records as error records.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import cli, cli_error, write_jsonl

from packtool.stages.tokenize.inputs.locators import expand_inputs
from packtool.stages.tokenize.inputs.locators.hub_select import select
from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk
from packtool.stages.tokenize.inputs.readers import registry
from packtool.stages.tokenize.inputs.readers.base import Numbering
from packtool.stages.tokenize.inputs.record import PlainText

READERS_DIR = Path(registry.__file__).parent


def _help() -> str:
    code, out, err = cli("tokenize", "--help")
    assert code == 0, err
    return "".join(out.split()).replace("│", "")  # the help box wraps and frames lines


def test_every_reader_module_is_registered() -> None:
    """A reader module without its registry line would be a source kind that is never read."""
    modules = {p.stem for p in READERS_DIR.glob("*.py")} - {"__init__", "base", "registry"}
    assert {m.rsplit(".", 1)[1] for m in registry._MODULES} == modules
    kinds = [r.kind for r in registry.readers()]
    assert len(kinds) == len(set(kinds)) and {"jsonl", "json", "parquet", "arrow", "txt"} <= set(kinds)


def test_every_suffix_reaches_its_reader_and_every_derived_text() -> None:
    help_text = _help()
    listed = registry.suffix_list()
    grouped = registry.suffix_text()
    for reader in registry.readers():
        assert reader.suffixes and all(s.startswith(".") and s == s.lower() for s in reader.suffixes), reader.kind
        assert registry.reader_named(reader.kind) is reader
        for suffix in reader.suffixes:
            assert registry.reader_for(f"dir.x/DATA{suffix.upper()}") is reader, suffix
            assert suffix in listed.replace(" or ", ", ").split(", "), suffix
            base = next((suffix[: -len(c)] for c in (".gz", ".zst") if suffix.endswith(c)), suffix)
            assert base in grouped and base in help_text, suffix
            if base != suffix:
                assert f"{base}(" in grouped and suffix[len(base) :] in grouped.split(base, 1)[1].split(",")[0]
    assert "save_to_disk" in help_text and "hf://datasets/ORG/NAME[@REVISION][/PATH]" in help_text


def test_error_texts_name_every_kind(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    (tmp_path / "notes.xyz").write_text("x")
    (tmp_path / "empty").mkdir()
    base = ("--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "out"))
    unsupported = cli_error("tokenize", str(tmp_path / "notes.xyz"), *base)
    empty = cli_error("tokenize", str(tmp_path / "empty"), *base)
    assert f"expected {registry.suffix_list()}" in unsupported
    assert f"directory holds no {registry.suffix_text()}, save_to_disk directories" in empty


def test_every_reader_has_a_hub_family(tmp_path: Path) -> None:
    """Without a PATH a snapshot reads its most common family: every kind belongs to one, whose rank breaks ties."""
    ranks: dict[str, int] = {}
    for reader in registry.readers():
        assert ranks.setdefault(reader.family, reader.family_rank) == reader.family_rank, reader.kind
        for suffix in reader.suffixes:
            data = tmp_path / f"train{suffix}"
            assert select([data.name, "README.md"], None, None, None, "o/n", "hf://datasets/o/n").files == (data.name,)
    assert len(set(ranks.values())) == len(ranks), ranks  # the tie order is explicit
    families = sorted(ranks, key=ranks.__getitem__)
    one_each = [f"f{i}{next(r.suffixes[0] for r in registry.readers() if r.family == f)}"
                for i, f in enumerate(families)]
    picked = select(one_each, None, None, None, "o/n", "hf://datasets/o/n").files
    assert picked == (one_each[0],)  # a tie: the lowest rank


def test_numbering_and_labels() -> None:
    for reader in registry.readers():
        assert isinstance(reader.numbering, Numbering)
        assert bool(reader.record_label) == (reader.numbering is Numbering.INDEX), reader.kind


# ---- the contract, over a file of every kind ----


def check_reader(path: Path, values: list[object], max_bytes: int) -> None:
    """The reader contract on one file holding `values` (in order), whose longest record is under `max_bytes`
    bytes and whose others are shorter than a tenth of it."""
    assert expand_inputs([str(path)]) == [path.resolve()]
    reader = registry.reader_for(path)
    assert reader is not None
    got_by_size = []
    for chunk_bytes in (1, 64, 1000, 1 << 40):
        sources, chunks = plan_chunks([path], chunk_bytes)
        again = plan_chunks([path], chunk_bytes)
        assert (sources, chunks) == again  # deterministic: resume keys depend on it
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert len(sources) == 1 and sources[0].n_bytes == path.stat().st_size
        records = [r for c in chunks for r in read_chunk(c)]
        assert [r.error for r in records] == [None] * len(values), [r.error for r in records if r.error][:3]
        assert [r.value for r in records] == values
        numbers = [r.line for r in records]
        numbering = registry.reader_named(chunks[0].kind).numbering
        if numbering is Numbering.INDEX:
            assert numbers == list(range(len(values)))
        elif numbering is Numbering.ROW:
            assert numbers == list(range(1, len(values) + 1))
        else:
            assert numbers == sorted(set(numbers)) and numbers[0] >= 1  # physical lines, increasing
        got_by_size.append(numbers)
    assert all(n == got_by_size[0] for n in got_by_size)  # the same numbers whatever the chunking
    _, chunks = plan_chunks([path], 1 << 40)
    limited = [r for c in chunks for r in read_chunk(c, max_record_bytes=max_bytes // 2)]
    assert len(limited) == len(values) and sum(r.error is not None for r in limited) >= 1
    assert all("over --max-record-bytes" in r.error for r in limited if r.error)


_ROWS = [{"text": t} for t in ["first", "second one", "x" * 5000, "", "naïve café 東京", "last"]]


def _write(kind: str, path: Path) -> tuple[Path, list[object]]:
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _ROWS).encode()
    if kind == "jsonl":
        return write_jsonl(path / "r.jsonl", list(_ROWS)), list(_ROWS)
    if kind == "jsonl.gz":
        (path / "r.jsonl.gz").write_bytes(gzip.compress(lines))
        return path / "r.jsonl.gz", list(_ROWS)
    if kind == "jsonl.zst":
        (path / "r.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
        return path / "r.jsonl.zst", list(_ROWS)
    if kind == "json":
        (path / "r.json").write_text(json.dumps(_ROWS, indent=1, ensure_ascii=False), encoding="utf-8")
        return path / "r.json", list(_ROWS)
    if kind == "json-lines":
        (path / "l.json").write_bytes(lines)
        return path / "l.json", list(_ROWS)
    table = pa.Table.from_pylist(_ROWS)
    if kind == "parquet":
        pq.write_table(table, path / "r.parquet", row_group_size=2)
        return path / "r.parquet", list(_ROWS)
    if kind == "arrow":
        with pa.OSFile(str(path / "r.arrow"), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
            writer.write_table(table, max_chunksize=2)
        return path / "r.arrow", list(_ROWS)
    assert kind == "txt"
    (path / "r.txt").write_text("one document\nover two lines\n", encoding="utf-8")
    return path / "r.txt", [PlainText("one document\nover two lines\n")]


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "json", "json-lines", "parquet", "arrow", "txt"])
def test_every_reader_keeps_the_contract(tmp_path: Path, kind: str) -> None:
    path, values = _write(kind, tmp_path)
    check_reader(path, values, max_bytes=5000 + 20 if kind != "txt" else 40)
