"""Issue 32's input defects and issue 34's per-file `--format auto`, each met through the CLI as a user meets it:
a wide CSV, classic-Mac line ends, a `meta.text` column, a latin-1 or binary CSV, a prompt cell that looks like
a JSON list, OpenAI's legacy `functions`, a late `weight`, and files of different shapes in one auto run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from input_support import same_store_bytes, tokenize_ok
from support import cli_error, crashing_executor, write_jsonl

import packtool
from packtool.exec.local import thread_executor


def _args(path: Path, tok: Path, out: Path, *flags: str) -> tuple[str, ...]:
    return ("tokenize", str(path), "--tokenizer", str(tok), "--output", str(out), *flags)


# ---- CSV ----


def test_a_csv_with_100k_columns_is_read_in_linear_time(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The duplicate-header check counted each name over the header: 100,000 columns never finished."""
    n = 100_000
    header = ",".join(["text", *(f"c{i}" for i in range(1, n))])
    row = ",".join(["hello world", *("x" for _ in range(1, n))])
    path = tmp_path / "wide.csv"
    path.write_text(f"{header}\n{row}\n{row}\n")
    start = time.perf_counter()
    out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / "wide")
    assert time.perf_counter() - start < 20
    same_store_bytes(write_and_tokenize(tmp_path, bpe_tokenizer_dir, [{"text": "hello world"}] * 2), out)
    dup = tmp_path / "dup.csv"
    dup.write_text(",".join([*(f"c{i}" for i in range(n)), "c7"]) + "\n" + ",".join("x" * (n + 1)) + "\n")
    assert "the header names field 'c7' twice" in cli_error(*_args(dup, bpe_tokenizer_dir, tmp_path / "d"))


def write_and_tokenize(tmp_path: Path, tok: Path, rows: list[dict[str, object]], *flags: str, name: str = "ref") -> Path:
    return tokenize_ok([write_jsonl(tmp_path / f"{name}.jsonl", rows)], tok, tmp_path / name, *flags)


def test_classic_mac_line_ends_end_rows_and_count_lines(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A lone \\r ends a row (as `csv` reads it) and counts as a line: a file over --max-record-bytes was refused
    as one header row, and every reject said line 1."""
    texts = [f"row {i} of a classic Mac file" for i in range(200)]
    body = "text,id\r" + "".join(f"{t},{i}\r" for i, t in enumerate(texts)) + '"two\rlines",x\rbad,\xff\r'
    path = tmp_path / "mac.csv"
    path.write_bytes(body.encode("utf-8").replace(b"\xc3\xbf", b"\xff"))
    rows = [{"text": t, "id": str(i)} for i, t in enumerate(texts)] + [{"text": "two\rlines", "id": "x"}]
    reference = write_and_tokenize(tmp_path, bpe_tokenizer_dir, rows)
    for chunk in ("64", "100000"):  # --max-record-bytes far under the file: each row is its own record
        out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"mac-{chunk}", "--max-record-bytes", "200",
                          "--chunk-bytes", chunk, "--on-error", "skip")
        same_store_bytes(reference, out)
        (reject,) = [json.loads(r) for r in (out / "rejects.jsonl").read_text().splitlines()]
        assert reject["line"] == 1 + len(texts) + 2 + 1, reject  # header, rows, a row over two lines
    assert f"mac.csv:{len(texts) + 4}" in cli_error(*_args(path, bpe_tokenizer_dir, tmp_path / "f"))
    crlf = tmp_path / "crlf.csv"  # \r\n stays one line end, even with a block boundary between \r and \n
    crlf.write_bytes(b"text,id\r\n" + b"".join(f"{t},{i}\r\n".encode() for i, t in enumerate(texts)))
    same_store_bytes(write_and_tokenize(tmp_path, bpe_tokenizer_dir, rows[:-1], name="ref2"),
                     tokenize_ok([crlf], bpe_tokenizer_dir, tmp_path / "crlf", "--chunk-bytes", "100"))


def test_a_latin1_or_binary_csv_is_told_about_its_encoding(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,id\ncafé au lait,1\n".encode("latin-1"))
    line = cli_error(*_args(latin, bpe_tokenizer_dir, tmp_path / "l"))
    assert "not UTF-8" in line and "iconv -f latin1 -t utf-8" in line and "quoting" not in line, line
    header = tmp_path / "header.csv"
    header.write_bytes("naïve,id\nx,1\n".encode("latin-1"))
    line = cli_error(*_args(header, bpe_tokenizer_dir, tmp_path / "h"))
    assert "not UTF-8" in line and "byte 0xef at byte 2" in line and "iconv" in line and "quoting" not in line, line
    binary = tmp_path / "blob.csv"
    binary.write_bytes(b'BLOB\x00\x00"\x08\x00' + bytes(range(256)) * 4)
    line = cli_error(*_args(binary, bpe_tokenizer_dir, tmp_path / "b"))
    assert "NUL byte at byte 4" in line and "quoting" not in line, line
    noise = tmp_path / "noise.csv"
    noise.write_bytes(bytes((i * 37 + 11) % 256 for i in range(4000)).replace(b"\0", b"\1"))
    assert "looks binary" in cli_error(*_args(noise, bpe_tokenizer_dir, tmp_path / "n"))
    for encoding in ("utf-16", "utf-16-le"):  # Excel's "Unicode text", with and without its byte order mark
        wide = tmp_path / f"{encoding}.csv"
        wide.write_bytes("text,id\nhello,1\n".encode(encoding))
        line = cli_error(*_args(wide, bpe_tokenizer_dir, tmp_path / "w"))
        assert "UTF-16" in line and "iconv -f utf-16 -t utf-8" in line, line
    import gzip
    import zipfile

    (tmp_path / "gz.csv").write_bytes(gzip.compress(b"text,id\nhello,1\n"))
    with zipfile.ZipFile(tmp_path / "book.csv", "w") as book:
        book.writestr("xl/worksheets/sheet1.xml", "<sheet/>" * 50)
    for name, said in (("gz.csv", "gzip-compressed"), ("book.csv", "a zip archive (an Excel .xlsx workbook?)")):
        line = cli_error(*_args(tmp_path / name, bpe_tokenizer_dir, tmp_path / "z"))
        assert f"not CSV text: it is {said}" in line and "quoting" not in line, line
    quote = tmp_path / "quote.csv"  # a real quoting problem keeps its own words
    quote.write_bytes(b'text,id\n"never closed,1\n')
    assert "quoted cell is not closed" in cli_error(*_args(quote, bpe_tokenizer_dir, tmp_path / "q"))


def test_a_prompt_that_looks_like_a_json_list_is_text_not_a_conversation(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    rows = [{"prompt": "[3, 1, 2]", "completion": " -> [1, 2, 3]"}, {"prompt": "hello", "completion": " world"}]
    path = tmp_path / "pc.csv"
    path.write_text('prompt,completion\n"[3, 1, 2]"," -> [1, 2, 3]"\nhello, world\n')
    for fmt in ("prompt-completion", "auto"):
        reference = write_and_tokenize(tmp_path, bpe_tokenizer_dir, rows, "--format", fmt, name=f"ref-{fmt}")
        same_store_bytes(reference, tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"csv-{fmt}", "--format", fmt))
        manifest = json.loads((tmp_path / f"csv-{fmt}" / "manifest.json").read_text())
        assert manifest["input_shape"]["name"] == "prompt-completion", manifest["input_shape"]


def test_a_dotted_column_name_is_read_literally_when_it_exists(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`pandas.json_normalize` writes `meta.text`: the literal name wins, else dots are a path (every input)."""
    nested = write_and_tokenize(tmp_path, bpe_tokenizer_dir, [{"meta": {"text": "hello there"}, "id": 1}],
                                "--field", "meta.text", name="nested")
    flat_csv = tmp_path / "flat.csv"
    flat_csv.write_text("id,meta.text\n1,hello there\n")
    same_store_bytes(nested, tokenize_ok([flat_csv], bpe_tokenizer_dir, tmp_path / "csv", "--field", "meta.text"))
    flat = write_and_tokenize(tmp_path, bpe_tokenizer_dir, [{"id": 1, "meta.text": "hello there"}],
                              "--field", "meta.text", name="flat")
    same_store_bytes(nested, flat)
    both = write_and_tokenize(tmp_path, bpe_tokenizer_dir, [{"meta": {"text": "not this"}, "meta.text": "hello there"}],
                              "--field", "meta.text", name="both")
    same_store_bytes(nested, both)  # the documented ambiguity: the literal key is read
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"id": 1, "meta.text": "hello there"}]), tmp_path / "flat.parquet")
    same_store_bytes(nested, tokenize_ok([tmp_path / "flat.parquet"], bpe_tokenizer_dir, tmp_path / "pq",
                                         "--field", "meta.text"))


# ---- OpenAI's keys are never dropped in silence ----

FUNCTIONS = [{"name": "get_weather", "description": "Weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
LEGACY = {"messages": [{"role": "user", "content": "USR Weather in Paris?"},
                       {"role": "assistant", "content": None,
                        "function_call": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                       {"role": "function", "name": "get_weather", "content": "21 C"},
                       {"role": "assistant", "content": "It is 21 C."}],
          "functions": FUNCTIONS, "parallel_tool_calls": False}
#: what OpenAI documents the legacy keys become: tools, tool_calls, a tool message
MODERN = {"messages": [LEGACY["messages"][0],
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                       {"role": "tool", "name": "get_weather", "content": "21 C"}, LEGACY["messages"][3]],
          "tools": [{"type": "function", "function": f} for f in FUNCTIONS]}


def test_openai_legacy_functions_are_tools_for_the_template(tmp_path: Path) -> None:
    """`functions` was dropped with exit 0 (the template never saw them), and `function_call` with it."""
    from test_chat_templates import build_tokenizer, fixture
    from test_openai_shape import reference

    from packtool.formats.token_store import open_token_store

    tok = build_tokenizer(tmp_path / "qwen", fixture("qwen2_5"))
    want = reference(tok, "qwen2_5", MODERN["messages"], MODERN["tools"])
    modern = write_and_tokenize(tmp_path, tok, [MODERN], "--format", "openai", name="modern")
    assert open_token_store(modern).document(0).tolist() == want
    for fmt in ("openai", "auto", "chat"):
        out = write_and_tokenize(tmp_path, tok, [LEGACY], "--format", fmt, name=f"legacy-{fmt}")
        same_store_bytes(modern, out)
    both = {**LEGACY, "tools": MODERN["tools"]}
    line = cli_error(*_args(write_jsonl(tmp_path / "both.jsonl", [both]), tok, tmp_path / "b", "--format", "openai"))
    assert "both 'tools' and OpenAI's legacy 'functions'" in line and "both.jsonl:1" in line, line


def test_a_late_weight_0_turn_is_never_trained_in_silence(tmp_path: Path) -> None:
    """`--format auto` decides on the first 64 records: a chat file whose record 100 weights a turn 0 trained it."""
    from test_chat_templates import build_tokenizer, fixture

    tok = build_tokenizer(tmp_path / "qwen", fixture("qwen2_5"))
    plain = {"messages": [{"role": "user", "content": "USR hi"}, {"role": "assistant", "content": "Hello!"}]}
    late = {"messages": [{"role": "user", "content": "USR one"}, {"role": "assistant", "content": "Uno.", "weight": 0},
                         {"role": "user", "content": "USR two"}, {"role": "assistant", "content": "Dos."}]}
    rows = [plain] * 100 + [late]
    given = write_and_tokenize(tmp_path, tok, rows, "--format", "openai", name="given")
    for fmt in ("auto", "chat"):
        same_store_bytes(given, write_and_tokenize(tmp_path, tok, rows, "--format", fmt, name=fmt))
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["input_shape"] == {"name": "chat", "detected": True}
    sharegpt = {"conversations": [{"from": "human", "value": "USR one"}, {"from": "gpt", "value": "Uno.", "weight": 0},
                                  {"from": "human", "value": "USR two"}, {"from": "gpt", "value": "Dos."}]}
    same_store_bytes(write_and_tokenize(tmp_path, tok, [late], "--format", "openai", name="one"),
                     write_and_tokenize(tmp_path, tok, [sharegpt], "--format", "sharegpt", name="sharegpt"))
    bad = {"conversations": [{"from": "human", "value": "x", "weight": 1}, {"from": "gpt", "value": "y"}]}
    line = cli_error(*_args(write_jsonl(tmp_path / "bad.jsonl", [bad]), tok, tmp_path / "b", "--format", "sharegpt"))
    assert "turn 0 has a 'weight' but is a 'user' message" in line, line
    for fmt, record in (("chat", {**plain, "weight": 0}), ("openai", {**late, "weight": 0.5}),
                        ("sharegpt", {**sharegpt, "weight": 0})):  # a record's own weight: never ignored
        src = write_jsonl(tmp_path / f"rw-{fmt}.jsonl", [record])
        line = cli_error(*_args(src, tok, tmp_path / "rw", "--format", fmt))
        assert "the record has 'weight'" in line and "per assistant message" in line, line
    same_store_bytes(write_and_tokenize(tmp_path, tok, [plain], "--format", "chat", name="w1a"),
                     write_and_tokenize(tmp_path, tok, [{**plain, "weight": 1}], "--format", "chat", name="w1b"))
    trl = {"prompt": [{"role": "user", "content": "x"}], "completion": [{"role": "assistant", "content": "y", "weight": 0}]}
    line = cli_error(*_args(write_jsonl(tmp_path / "trl.jsonl", [trl]), tok, tmp_path / "t", "--format",
                            "prompt-completion"))
    assert "message 1 has a 'weight'" in line and "--format openai" in line, line


# ---- --format auto decides per file (issue 34, item 7) ----


def _docs(store: Path) -> tuple[list[list[int]], list[list[int]] | None]:
    from packtool.formats.token_store import open_token_store

    s = open_token_store(store)
    loss = None if s.loss is None else [s.loss[s.starts[d] : s.boundaries[d]].tolist() for d in range(s.n_documents)]
    return [s.document(d).tolist() for d in range(s.n_documents)], loss


def test_auto_reads_a_chat_file_and_a_sharegpt_file_each_as_its_own(tmp_path: Path) -> None:
    """It picked one shape from the first file and rejected every record of the other."""
    from test_chat_templates import build_tokenizer, fixture

    tok = build_tokenizer(tmp_path / "qwen", fixture("qwen2_5"))
    chat = [{"messages": [{"role": "user", "content": f"USR hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(80)]
    sharegpt = [{"conversations": [{"from": "human", "value": f"USR q {i}"}, {"from": "gpt", "value": f"a {i}"}]}
                for i in range(30)]
    a = write_jsonl(tmp_path / "a_chat.jsonl", chat)
    b = tmp_path / "b_sharegpt.csv"
    b.write_text("conversations\n" + "".join('"' + json.dumps(r["conversations"]).replace('"', '""') + '"\n'
                                             for r in sharegpt))
    ref_a = tokenize_ok([a], tok, tmp_path / "ref-a", "--format", "chat")
    ref_b = tokenize_ok([write_jsonl(tmp_path / "sg.jsonl", sharegpt)], tok, tmp_path / "ref-b", "--format", "sharegpt")
    want = [x + y for x, y in zip(_docs(ref_a), _docs(ref_b), strict=True)]
    for flags in ((), ("--workers", "2", "--chunk-bytes", "300")):
        out = tokenize_ok([a, b], tok, tmp_path / f"auto{len(flags)}", "--format", "auto", *flags)
        assert list(_docs(out)) == want
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input_shape"] == {"name": "chat", "detected": True, "shapes": ["chat", "sharegpt"]}
    assert [(s["input_shape"], s["documents"], s["rejected"]) for s in manifest["sources"]] == [
        ("chat", 80, 0), ("sharegpt", 30, 0)]
    assert manifest["sources"][1]["fields"] == {"messages_field": "conversations", "system_field": "system"}
    one = tokenize_ok([a, write_jsonl(tmp_path / "c_chat.jsonl", chat[:3])], tok, tmp_path / "same", "--format", "auto")
    assert "shapes" not in json.loads((one / "manifest.json").read_text())["input_shape"]  # one shape: as before
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "plain"}])
    line = cli_error(*_args(a, tok, tmp_path / "x", "--format", "auto")[:2], str(text), "--tokenizer", str(tok),
                     "--output", str(tmp_path / "x"), "--format", "auto")
    assert "found chat records" in line and "text records" in line and "two runs" in line, line
    lmsys = write_jsonl(tmp_path / "d_lmsys.jsonl", [{"conversation": r["messages"]} for r in chat[:3]])
    two = tokenize_ok([a, lmsys], tok, tmp_path / "lmsys", "--format", "auto")  # one shape, two fields
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["input_shape"]["shapes"] == ["chat"]
    assert [s["fields"]["messages_field"] for s in manifest["sources"]] == ["messages", "conversation"]
    assert _docs(two)[0] == _docs(ref_a)[0] + _docs(ref_a)[0][:3]
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [chat[0], sharegpt[0]])  # one file of two shapes: as before
    line = cli_error("tokenize", str(a), str(mixed), "--tokenizer", str(tok), "--output", str(tmp_path / "m"),
                     "--format", "auto")
    assert "two record shapes" in line and "mixed.jsonl:2" in line, line


def test_auto_mixes_text_and_prompt_completion_with_exact_targets(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A shape whose every token is a target beside one with a loss mask: the text file's tokens are all 1."""
    text = [{"text": f"plain text number {i} " * 3} for i in range(40)]
    pc = [{"prompt": f"question {i}?", "completion": f" answer {i}"} for i in range(40)]
    a, b = write_jsonl(tmp_path / "a.jsonl", pc), write_jsonl(tmp_path / "b.jsonl", text)
    ids_a, loss_a = _docs(tokenize_ok([a], bpe_tokenizer_dir, tmp_path / "ra", "--format", "prompt-completion"))
    ids_b, _ = _docs(tokenize_ok([b], bpe_tokenizer_dir, tmp_path / "rb", "--format", "text"))
    assert loss_a is not None
    for flags in ((), ("--workers", "2", "--chunk-bytes", "200")):
        ids, loss = _docs(tokenize_ok([a, b], bpe_tokenizer_dir, tmp_path / f"o{len(flags)}", "--format", "auto", *flags))
        assert ids == ids_a + ids_b and loss == loss_a + [[1] * len(d) for d in ids_b]


def test_a_run_of_per_file_shapes_resumes_with_the_same_bytes(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Each chunk carries its file's shape: a killed run resumes its chunks and ends with the uninterrupted bytes."""
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"q {i}?", "completion": f" a {i}"} for i in range(200)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": f"text {i} " * 4} for i in range(200)])

    def config(out: str) -> packtool.TokenizeConfig:
        return packtool.TokenizeConfig(inputs=(str(a), str(b)), tokenizer=str(bpe_tokenizer_dir),
                                       output=str(tmp_path / out), chunk_bytes=1500, workers=1, format="auto")

    reference = packtool.tokenize_corpus(config("ref"))
    assert reference.n_chunks > 6
    with pytest.raises(KeyboardInterrupt):
        packtool.tokenize_corpus(config("resumed"), executor=crashing_executor(5))
    resumed = packtool.tokenize_corpus(config("resumed"), executor=thread_executor(2))
    assert resumed.reused_chunks == 5
    same_store_bytes(tmp_path / "ref", tmp_path / "resumed")
    assert resumed.manifest["sources"] == reference.manifest["sources"]


def test_latin1_jsonl_and_txt_are_told_to_re_encode(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The same class in the other text readers: the fix names the encoding, not 'fix the record'."""
    jsonl = tmp_path / "l.jsonl"
    jsonl.write_bytes('{"text": "ok"}\n{"text": "café"}\n'.encode("latin-1"))
    line = cli_error(*_args(jsonl, bpe_tokenizer_dir, tmp_path / "j"))
    assert "invalid UTF-8" in line and "l.jsonl:2" in line and "iconv -f latin1 -t utf-8" in line, line
    txt = tmp_path / "l.txt"
    txt.write_bytes("fine\nna\xefve\n".encode("latin-1"))
    line = cli_error(*_args(txt, bpe_tokenizer_dir, tmp_path / "t"))
    assert "byte 0xef" in line and "l.txt:2" in line and "iconv -f latin1 -t utf-8" in line, line


def test_a_table_naming_a_column_twice_is_a_file_error(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The CSV header check's class in parquet and Arrow, which allow a name twice: a row kept one value silently."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([pa.array(["first"]), pa.array(["second"])], names=["text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pa.OSFile(str(tmp_path / "dup.arrow"), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
        writer.write_table(table)
    for name in ("dup.parquet", "dup.arrow"):
        line = cli_error(*_args(tmp_path / name, bpe_tokenizer_dir, tmp_path / "o", "--on-error", "skip"))
        assert "names column 'text' twice" in line and name in line, line
    struct = pa.StructArray.from_arrays([pa.array(["a"]), pa.array(["b"])], names=["text", "text"])
    pq.write_table(pa.Table.from_arrays([struct], names=["meta"]), tmp_path / "nested.parquet")
    line = cli_error(*_args(tmp_path / "nested.parquet", bpe_tokenizer_dir, tmp_path / "o", "--field", "meta.text"))
    assert "the field 'text' of struct 'meta' twice" in line, line
    assert not (tmp_path / "o").exists()


def test_a_column_name_with_a_space_is_named_in_the_error(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`id, text` (a space after the comma) names the column ' text': the missing-field error shows it."""
    path = tmp_path / "space.csv"
    path.write_text("id, text\n1, hello\n")
    line = cli_error(*_args(path, bpe_tokenizer_dir, tmp_path / "o"))
    assert "missing field 'text' (the record has ' text'" in line and "space.csv:2" in line, line


def test_auto_refuses_preference_pairs_beside_single_documents(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A preference file (chosen, rejected) beside a prompt-completion file: pairs and documents, one store."""
    pc = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "q?", "completion": " a"}] * 3)
    pref = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "q?", "chosen": " good", "rejected": " bad"}] * 3)
    line = cli_error("tokenize", str(pc), str(pref), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                     str(tmp_path / "o"), "--format", "auto")
    assert "records (" in line and "preference store holds pairs" in line and "two runs" in line, line
    assert not (tmp_path / "o").exists()
