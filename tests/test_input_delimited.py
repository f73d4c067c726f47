"""CSV and TSV inputs (`.csv`, `.tsv`, `.gz`, `.zst`): the header names the fields, a JSON cell is parsed,
quoted cells span lines; the same records give jsonl's bytes for any worker count and chunking; broken files
give one line at file:line (the physical line a row starts on)."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from input_support import check_resume, hub_repo, same_store_bytes, tokenize_ok
from support import cli_error, write_jsonl, zipf_texts
from test_input_readers import check_reader

from packtool.core.encoding.shapes.fields import JsonText, structured
from packtool.stages.tokenize.inputs import streams
from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk
from packtool.stages.tokenize.inputs.readers import delimited


def _csv_bytes(header: list[str], rows: list[list[str]], delimiter: str = ",", newline: str = "\r\n") -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator=newline)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def _write(path: Path, data: bytes) -> Path:
    """`data` to `path`, compressed as its name says."""
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def _table(records: list[dict[str, object]]) -> tuple[list[str], list[list[str]]]:
    """Records -> a header and rows; a list or dict value as its JSON text (what the reader parses back)."""
    header = list(records[0])
    cell = lambda v: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)  # noqa: E731
    return header, [[cell(r[name]) for name in header] for r in records]


def _texts(n: int, seed: int) -> list[str]:
    """Texts holding what CSV must quote: delimiters, quotes, newlines (\\n and \\r\\n), tabs, an empty one."""
    texts = zipf_texts(n, seed=seed, max_words=60)
    extras = ["", 'a "quoted" word, and a comma', "two\nlines", "crlf\r\ninside", "a\ttab", "[not json", "naïve 東京 🙂"]
    return [t + (" " + extras[i % len(extras)] if i % 3 else "") for i, t in enumerate(texts)] + extras


_KINDS = ["r.csv", "r.tsv", "r.csv.gz", "r.csv.zst", "r.tsv.gz", "r.tsv.zst"]


@pytest.mark.parametrize("name", _KINDS)
def test_every_kind_keeps_the_reader_contract(tmp_path: Path, name: str) -> None:
    records = [{"text": t, "n": str(i)} for i, t in enumerate(["first", "x" * 5000, "two\nlines", "", "last"])]
    header, rows = _table(records)
    path = _write(tmp_path / name, _csv_bytes(header, rows, "\t" if ".tsv" in name else ","))
    check_reader(path, records, max_bytes=5020)


_SHAPES = {
    "text": (lambda i, t: {"text": t}, ()),
    "prompt-completion": (lambda i, t: {"q": t[: len(t) // 2], "a": t[len(t) // 2 :]},
                          ("--format", "prompt-completion", "--prompt-field", "q", "--completion-field", "a")),
    "chat": (lambda i, t: {"id": str(i), "messages": [{"role": "user", "content": t[:40]},
                                                      {"role": "assistant", "content": t[40:] or "ok"}]},
             ("--format", "chat")),
}


@pytest.mark.parametrize("shape", list(_SHAPES))
def test_the_same_records_give_the_bytes_of_jsonl(tmp_path: Path, bpe_tokenizer_dir: Path, shape: str) -> None:
    make, flags = _SHAPES[shape]
    records = [make(i, t) for i, t in enumerate(_texts(40, seed=7))]
    reference = tokenize_ok([write_jsonl(tmp_path / "r.jsonl", records)], bpe_tokenizer_dir, tmp_path / "ref",
                          "--workers", "1", *flags)
    header, rows = _table(records)
    for name in _KINDS:
        path = _write(tmp_path / name, _csv_bytes(header, rows, "\t" if ".tsv" in name else ",",
                                                  newline="\n" if "gz" in name else "\r\n"))
        for workers, chunk in (("1", "64"), ("2", "64"), ("2", "1000")):
            out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"{name}-{workers}-{chunk}", "--workers", workers,
                            "--chunk-bytes", chunk, *flags)
            same_store_bytes(reference, out)


def test_a_lone_carriage_return_ends_a_row_as_csv_reads_it(tmp_path: Path) -> None:
    """Classic Mac OS line ends: a lone \r ends a row and a line (it was one row, every record on line 1)."""
    path = _write(tmp_path / "cr.csv", b'x,y\ra,b\rc,"d\re"\nf,g\r\nh,i\r')
    for chunk_bytes in (1, 7, 1000):
        _, chunks = plan_chunks([path], chunk_bytes)
        assert [(r.line, r.value) for c in chunks for r in read_chunk(c)] == [
            (2, {"x": "a", "y": "b"}), (3, {"x": "c", "y": "d\re"}), (5, {"x": "f", "y": "g"}), (6, {"x": "h", "y": "i"})]


def test_a_cell_is_its_text_and_holds_json_only_when_it_is_an_array_or_object(tmp_path: Path) -> None:
    header = ["a", "b", "c", "d", "e"]
    path = _write(tmp_path / "v.csv", _csv_bytes(header, [['  [1, {"x": "y"}]', '{"k": 2}', "[not json", "42",
                                                             '"s"']]))
    _, chunks = plan_chunks([path], 1 << 20)
    (record,) = [r for c in chunks for r in read_chunk(c)]
    assert record.value == {"a": '  [1, {"x": "y"}]', "b": '{"k": 2}', "c": "[not json", "d": "42", "e": '"s"'}
    assert [type(v) for v in record.value.values()] == [JsonText, JsonText, JsonText, str, str]
    assert [structured(v) for v in record.value.values()] == [[1, {"x": "y"}], {"k": 2}, "[not json", "42", '"s"']


#: text that is valid JSON (LLaMA-Factory's alpaca_en_demo has an `input` of "[4,21,11,32,14]"): read as a list,
#: it was "field 'input' is not a string (got list)" and the record was lost; jsonl reads it as text
_JSON_LOOKING = ["[4,21,11,32,14]", '{"a": 1}', " [] ", "[[1, 2], [3]]"]
_TEXT_SHAPES = {
    "text": ([{"text": t} for t in _JSON_LOOKING], ()),
    "alpaca": ([{"instruction": "Reverse the list.", "input": t, "output": t[::-1], "system": t}
                for t in _JSON_LOOKING], ("--format", "alpaca")),
    "prompt-completion": ([{"prompt": "Q: " + t, "completion": t} for t in _JSON_LOOKING],
                          ("--format", "prompt-completion")),
    "auto": ([{"text": t} for t in _JSON_LOOKING], ()),
}


@pytest.mark.parametrize("shape", list(_TEXT_SHAPES))
def test_a_text_cell_that_is_valid_json_stays_text(tmp_path: Path, bpe_tokenizer_dir: Path, shape: str) -> None:
    records, flags = _TEXT_SHAPES[shape]
    reference = tokenize_ok([write_jsonl(tmp_path / "r.jsonl", records)], bpe_tokenizer_dir, tmp_path / "ref", *flags)
    header, rows = _table(records)
    for name in ("r.csv", "r.tsv.gz"):
        path = _write(tmp_path / name, _csv_bytes(header, rows, "\t" if ".tsv" in name else ","))
        same_store_bytes(reference, tokenize_ok([path], bpe_tokenizer_dir, tmp_path / name.replace(".", "-"), *flags))


def test_json_cells_where_a_shape_reads_structure(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Alpaca `history`, ShareGPT `conversations`, `tools`, and a dotted path into an object cell read the
    value the cell holds, with the same bytes as jsonl."""
    history = [["hi", "hello"], ["[1]", "{}"]]
    cases = {
        "alpaca": ([{"instruction": "go", "input": "", "output": "[done]", "history": history}], ("--format", "alpaca")),
        "sharegpt": ([{"conversations": [{"from": "human", "value": "[q]"}, {"from": "gpt", "value": "{a}"}]}],
                     ("--format", "sharegpt")),
        "dotted": ([{"meta": {"body": {"text": "[nested] text"}}}], ("--field", "meta.body.text")),
    }
    for name, (records, flags) in cases.items():
        reference = tokenize_ok([write_jsonl(tmp_path / f"{name}.jsonl", records)], bpe_tokenizer_dir,
                                tmp_path / f"{name}-ref", *flags)
        header, rows = _table(records)
        path = _write(tmp_path / f"{name}.csv", _csv_bytes(header, rows, ","))
        same_store_bytes(reference, tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"{name}-csv", *flags))


def test_rows_that_do_not_fit_are_bad_records_at_their_line(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Ragged rows, a row that is not UTF-8, a row over --max-record-bytes: per-record errors at the physical
    line the row starts on (quoted cells over several lines counted), the rest kept."""
    data = (b'text,id\n"one\nover two lines",1\nragged,2,extra\n"a ""big"" one ' + b"w" * 300 + b'",3\n'
            b'bad \xff byte,4\nshort\n"fine\r\nagain",6\n')
    for name in ("r.csv", "r.csv.gz"):
        path = _write(tmp_path / name, data)
        args = ("tokenize", str(path), "--tokenizer", str(bpe_tokenizer_dir), "--max-record-bytes", "200")
        line = cli_error(*args, "--output", str(tmp_path / "fail"))
        assert "the row has 3 cells, the header names 2 fields" in line and f"{name}:4" in line, line
        out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"{name}-skip", "--max-record-bytes", "200",
                        "--on-error", "skip")
        rejects = [json.loads(r) for r in (out / "rejects.jsonl").read_text().splitlines()]
        assert [(r["line"], r["reason"].split(" (")[0].split(",")[0]) for r in rejects] == [
            (4, "the row has 3 cells"), (5, "record is 318 bytes"), (6, "invalid UTF-8"), (7, "the row has 1 cells")]
        reference = tokenize_ok([write_jsonl(tmp_path / "good.jsonl", [{"text": "one\nover two lines", "id": "1"},
                                                                      {"text": "fine\r\nagain", "id": "6"}])],
                              bpe_tokenizer_dir, tmp_path / "good")
        same_store_bytes(reference, out)


@pytest.mark.parametrize("name", ["r.csv", "r.tsv.zst"])
def test_an_unclosed_quote_is_a_file_error(tmp_path: Path, bpe_tokenizer_dir: Path, name: str) -> None:
    sep = b"\t" if ".tsv" in name else b","
    path = _write(tmp_path / name, b"text" + sep + b"id\nfine" + sep + b'1\n"never\nclosed' + sep + b"2\nmore" + sep + b"3\n")
    for extra in ((), ("--on-error", "skip")):  # a broken file is an error even in skip mode
        line = cli_error("tokenize", str(path), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                         str(tmp_path / "out"), *extra)
        assert "a quoted cell is not closed" in line and name in line, line
        if name == "r.csv":
            assert f"{name}:3" in line  # the line the open row starts on, found while planning
    assert not (tmp_path / "out").exists()


def test_header_problems_are_file_errors_and_a_bom_is_not_a_field(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    base = ("--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "out"))
    dup = _write(tmp_path / "dup.csv", b"text,id,text\na,1,b\n")
    assert "the header names field 'text' twice" in cli_error("tokenize", str(dup), *base)
    bad = _write(tmp_path / "bad.csv", b"te\xffxt\na\n")
    assert "the file is not UTF-8 text: byte 0xff at byte 2" in cli_error("tokenize", str(bad), *base)
    only = _write(tmp_path / "only.csv", b"text\n")
    assert "no documents to tokenize" in cli_error("tokenize", str(only), *base)
    records = [{"text": t} for t in _texts(12, seed=3)]
    header, rows = _table(records)
    plain = _write(tmp_path / "plain.csv", _csv_bytes(header, rows))
    bom = _write(tmp_path / "bom.csv", b"\xef\xbb\xbf" + _csv_bytes(header, rows))
    same_store_bytes(tokenize_ok([plain], bpe_tokenizer_dir, tmp_path / "p"),
                tokenize_ok([bom], bpe_tokenizer_dir, tmp_path / "b", "--chunk-bytes", "50"))


def test_an_interrupted_run_resumes_with_the_same_bytes(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    records = [{"text": t} for t in _texts(300, seed=12)]
    path = _write(tmp_path / "r.csv", _csv_bytes(*_table(records)))
    manifest = check_resume(path, bpe_tokenizer_dir, tmp_path, chunk_bytes=1500)
    assert manifest["sources"][0]["records"] == len(records)  # type: ignore[index]


def test_a_hub_snapshot_of_csv_files_reads_its_train_split(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    train = [{"text": t} for t in _texts(10, seed=1)]
    files = {"data/train.csv": _csv_bytes(*_table(train)), "data/test.csv": _csv_bytes(["text"], [["held out"]]),
             "notes.txt": b"a readme, not data"}
    hub_repo(tmp_path / "hub", "datasets", "org/tables", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    reference = tokenize_ok([write_jsonl(tmp_path / "r.jsonl", train)], bpe_tokenizer_dir, tmp_path / "ref")
    same_store_bytes(reference, tokenize_ok(["hf://datasets/org/tables"], bpe_tokenizer_dir, tmp_path / "hub-out"))


_CELL = st.text(alphabet=st.sampled_from('ab ",\t\n\ré'), max_size=8)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.lists(_CELL, min_size=3, max_size=3), max_size=10), tsv=st.booleans(),
       newline=st.sampled_from(["\n", "\r\n", "\r"]), block=st.integers(1, 40), chunk_bytes=st.integers(1, 120))
def test_rows_equal_csv_dictreader_for_any_blocks_and_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             rows: list[list[str]], tsv: bool, newline: str,
                                                             block: int, chunk_bytes: int) -> None:
    """Quotes, delimiters and newlines anywhere in cells, cut by any block and chunk boundary: the rows `csv`
    reads from the whole file, never a cut inside a quoted cell."""
    delimiter = "\t" if tsv else ","
    if newline != "\r\n":  # csv.writer then leaves a lone \r or \n unquoted, which ends a row: not 3 cells
        rows = [[c.replace("\r", "r").replace("\n", "n") for c in row] for row in rows]
    data = _csv_bytes(["x", "y", "z"], rows, delimiter, newline)
    path = _write(tmp_path / ("p.tsv" if tsv else "p.csv"), data)
    want = list(csv.DictReader(io.StringIO(data.decode(), newline=""), delimiter=delimiter))
    monkeypatch.setattr(delimited, "_BLOCK", block)
    monkeypatch.setattr(delimited, "_HEADER_BLOCK", block)
    monkeypatch.setattr(streams, "_BLOCK", block)
    _, chunks = plan_chunks([path], chunk_bytes)
    records = [r for c in chunks for r in read_chunk(c)]
    assert [r.error for r in records] == [None] * len(want)
    assert [r.value for r in records] == want
    breaks = lambda b: len(b.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")) - 1  # noqa: E731
    header_lines = breaks(_csv_bytes(["x", "y", "z"], [], delimiter, newline))
    sizes = [breaks(_csv_bytes(["x", "y", "z"], [row], delimiter, newline)) - header_lines for row in rows]
    starts = [1 + header_lines + sum(sizes[:i]) for i in range(len(rows))]  # the physical line each row starts on
    assert [r.line for r in records] == starts
