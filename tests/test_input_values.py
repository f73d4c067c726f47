"""Values as Arrow and `datasets` 5.2.0 store them: the same records give the same bytes as jsonl, and no
encoding of a column escapes `--max-record-bytes`; hostile nesting is a bad record, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from input_support import same_store_bytes, tokenize_ok
from support import cli_error, write_jsonl

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"


def _sharegpt_rows() -> list[dict[str, object]]:
    """Turns whose keys differ between records: `datasets`' json loader stores them as list<arrow.json>."""
    return [
        {"conversations": [{"from": "human", "value": "hi there", "lang": "en"}, {"from": "gpt", "value": "hello"}]},
        {"conversations": [{"from": "human", "value": "2 + 2?"}, {"from": "gpt", "value": "4", "score": 0.5}]},
        {"conversations": [{"from": "system", "value": "be brief", "tags": ["a", "b"]},
                           {"from": "human", "value": "why?"}, {"from": "gpt", "value": "because"}]},
    ]


def _tool_rows() -> list[dict[str, object]]:
    """Chat messages with `tool_calls` on some only (and a `content` of another type on one)."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    return [
        {"messages": [{"role": "user", "content": "add 2 and 2"},
                      {"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "content": "4"}, {"role": "assistant", "content": "It is 4."}]},
        {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]},
    ]


def _datasets_sources(root: Path, jsonl: Path) -> dict[str, Path]:
    """`datasets` 5.2.0's own json loader over the jsonl, saved to disk, to parquet and as an Arrow IPC file."""
    loaded = datasets.Dataset.from_json(str(jsonl), cache_dir=str(root / "hf-cache"))
    column = loaded.data.table.schema.field(0).type
    assert isinstance(column.value_type, pa.JsonType), column  # the layout under test
    loaded.save_to_disk(str(root / "saved"))
    loaded.to_parquet(str(root / "r.parquet"))
    with pa.OSFile(str(root / "r.arrow"), "wb") as fh, pa.ipc.new_file(fh, loaded.data.table.schema) as writer:
        writer.write_table(loaded.data.table)
    assert pq.read_schema(root / "r.parquet").field(0).type.value_type == pa.json_()
    return {"saved": root / "saved", "parquet": root / "r.parquet", "arrow": root / "r.arrow"}


@pytest.mark.parametrize(("rows", "flags"), [
    (_sharegpt_rows(), ("--format", "sharegpt")),
    (_tool_rows(), ("--format", "chat", "--chat-template", "qwen2_5")),
])
def test_json_extension_values_give_the_bytes_of_jsonl(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                       rows: list[dict[str, object]], flags: tuple[str, ...]) -> None:
    if "--chat-template" in flags:  # a template that renders tool_calls (their arguments as JSON)
        template = tmp_path / "qwen2_5.jinja"
        template.write_text(json.loads((FIXTURES / "qwen2_5.json").read_text())["chat_template"])
        flags = (*flags[:-1], str(template))
    jsonl = write_jsonl(tmp_path / "r.jsonl", rows)
    reference = tokenize_ok([jsonl], bpe_tokenizer_dir, tmp_path / "ref", *flags)
    for kind, path in _datasets_sources(tmp_path / "src", jsonl).items():
        for workers in ("1", "2"):
            out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / f"{kind}{workers}", "--workers", workers,
                            "--on-error", "skip", "--chunk-bytes", "200", *flags)
            same_store_bytes(reference, out)
            assert not (out / "rejects.jsonl").exists() or not (out / "rejects.jsonl").read_text(), kind


def test_a_broken_json_extension_value_is_a_bad_record(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    values = pa.array(['[{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]', '[{"from": '])
    turns = pa.ExtensionArray.from_storage(pa.json_(), values)
    pq.write_table(pa.table({"conversations": turns}), tmp_path / "t.parquet")
    line = cli_error("tokenize", str(tmp_path / "t.parquet"), "--tokenizer", str(bpe_tokenizer_dir), "--format",
                     "sharegpt", "--output", str(tmp_path / "out"))
    assert "malformed JSON in an arrow.json value" in line and "t.parquet:2" in line


def _encoded(values: list[str], how: str) -> pa.Array:
    if how == "dictionary":
        return pa.array(values).dictionary_encode()
    if how == "run_end":
        return pa.RunEndEncodedArray.from_arrays(list(range(1, len(values) + 1)), values)
    return pa.array(values, {"string_view": pa.string_view(), "large_string": pa.large_string()}[how])


@pytest.mark.parametrize("how", ["dictionary", "string_view", "large_string", "run_end"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("container", ["arrow", "parquet"])
def test_every_string_encoding_is_held_to_max_record_bytes(tmp_path: Path, bpe_tokenizer_dir: Path, how: str,
                                                          nested: bool, container: str) -> None:
    """A dictionary-encoded or string_view text once passed a 100 kB limit at 5 MB (and a 50 MB one took 4.6 GB)."""
    if container == "parquet" and how == "run_end":
        pytest.skip("parquet has no run-end encoding")
    texts = ["a short one", "x " * 60_000, "another short one", "x " * 60_000]  # 120 kB records
    column = _encoded(texts, how)
    if nested:  # inside a struct and a list: `--field doc.body`, the struct's bytes counted through its children
        column = pa.StructArray.from_arrays([column, pa.array([["t"]] * 4)], ["body", "tags"])
    table = pa.table({"doc" if nested else "text": column})
    path = tmp_path / f"t.{container}"
    if container == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
            writer.write_table(table)
    field = ("--field", "doc.body") if nested else ()
    out = tokenize_ok([path], bpe_tokenizer_dir, tmp_path / "s", "--max-record-bytes", "100000", "--on-error", "skip",
                    *field)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"].split(",")[0]) for r in rejects] == [
        (2, "record is 120000 bytes"), (4, "record is 120000 bytes")] if not nested else [
        (2, "record is 120001 bytes"), (4, "record is 120001 bytes")]
    reference = tokenize_ok([write_jsonl(tmp_path / "r.jsonl", [{"text": texts[0]}, {"text": texts[2]}])],
                          bpe_tokenizer_dir, tmp_path / "ref")
    same_store_bytes(reference, out)


def test_deep_nesting_is_a_bad_record_in_every_json_reader(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A `{`-first `.json` whose first line nests 100k deep raised RecursionError while packtool told JSON Lines
    from one object over several lines; the same depth in a jsonl line, a .json array or a .jsonl.gz is a bad record."""
    import gzip

    deep = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    good = json.dumps({"text": "a good record"})
    files = {"first.json": f"{deep}\n{good}\n", "lines.jsonl": f"{good}\n{deep}\n", "array.json": f"[{good}, {deep}]"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "lines.jsonl.gz").write_bytes(gzip.compress(files["lines.jsonl"].encode()))
    reference = tokenize_ok([write_jsonl(tmp_path / "ref.jsonl", [{"text": "a good record"}])], bpe_tokenizer_dir,
                          tmp_path / "ref")
    for name, where in (("first.json", "first.json:1"), ("lines.jsonl", "lines.jsonl:2"),
                        ("array.json", "array.json:1"), ("lines.jsonl.gz", "lines.jsonl.gz:2")):
        line = cli_error("tokenize", str(tmp_path / name), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                         str(tmp_path / "fail"))
        assert "bad record: malformed JSON" in line and where in line, line
        same_store_bytes(reference, tokenize_ok([tmp_path / name], bpe_tokenizer_dir, tmp_path / name.replace(".", "_"),
                                         "--on-error", "skip"))
