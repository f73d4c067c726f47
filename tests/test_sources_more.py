"""The sources users have: `.json` arrays, Arrow files, `save_to_disk` directories, the hub cache.

Every source must give the same bytes as jsonl for the same records (text and chat), for any
worker count and chunking, resume included; broken inputs give one-line errors.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.feather as pa_feather
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from input_support import check_resume, hub_repo
from input_support import same_store_bytes as _same_bytes
from input_support import tokenize_ok as _tokenize
from support import cli, cli_error, write_jsonl, zipf_texts

import packtool
from packtool.errors import InputError
from packtool.stages.tokenize.inputs import jsonscan as jsonarray
from packtool.stages.tokenize.inputs import streams
from packtool.stages.tokenize.inputs.locators import expand_inputs
from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk


def _chat_rows(n: int, seed: int) -> list[dict[str, object]]:
    texts = zipf_texts(3 * n, seed=seed, max_words=40)
    rows: list[dict[str, object]] = []
    for i in range(n):
        messages = [{"role": "user", "content": texts[3 * i]}, {"role": "assistant", "content": texts[3 * i + 1]}]
        if i % 3 == 0:
            messages += [{"role": "user", "content": texts[3 * i + 2] + ' "q" [x] {y}, \\'}, {"role": "assistant", "content": "ok"}]
        if i % 4 == 1:  # tool_calls on some messages only: `datasets`' json loader stores them as arrow.json
            call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": texts[3 * i + 2]}}}
            messages[1]["tool_calls"] = [call]
        rows.append({"id": i, "messages": messages})
    return rows


def _text_rows(n: int, seed: int) -> list[dict[str, object]]:
    texts = zipf_texts(n, seed=seed) + ["", "naïve café 東京 🙂", 'quotes " and \\ and ] and }, inside']
    return [{"text": t, "meta": {"n": i}} for i, t in enumerate(texts)]


def _sharegpt_rows(n: int, seed: int) -> list[dict[str, object]]:
    """ShareGPT records whose optional keys come and go (Arrow and parquet fill the gaps with null)."""
    texts = zipf_texts(2 * n, seed=seed, max_words=30)
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"conversations": [{"from": "human", "value": texts[2 * i]},
                                                    {"from": "gpt", "value": texts[2 * i + 1]}]}
        if i % 5 == 2:  # turns whose keys differ between records (stored as arrow.json by `datasets`' json loader)
            row["conversations"][0]["lang"] = "en"  # type: ignore[index]
            row["conversations"][1]["score"] = i / 7  # type: ignore[index]
        if i % 3 == 0:
            row["system"] = f"You are assistant {i}."
        rows.append(row)
    return rows


def _alpaca_rows(n: int, seed: int) -> list[dict[str, object]]:
    texts = zipf_texts(3 * n, seed=seed, max_words=30)
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"instruction": texts[3 * i], "input": texts[3 * i + 1] if i % 2 else "",
                                  "output": texts[3 * i + 2]}
        if i % 4 == 0:  # the first row holds every key: `Dataset.from_list` takes its columns from it
            row["history"] = [["earlier question", "earlier answer"]]
        rows.append(row)
    return rows


def _write_sources(root: Path, rows: list[dict[str, object]]) -> dict[str, Path]:
    """The same records as jsonl, a pretty-printed .json array, parquet, save_to_disk, Arrow file and stream, feather."""
    root.mkdir(parents=True)
    out = {"jsonl": write_jsonl(root / "r.jsonl", rows)}
    (root / "r.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    out["json"] = root / "r.json"
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(root / "r.parquet"))
    out["parquet"] = root / "r.parquet"
    ds.save_to_disk(str(root / "saved"), num_shards=3)
    out["save_to_disk"] = root / "saved"
    table = ds.data.table
    with pa.OSFile(str(root / "file.arrow"), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=7):
            writer.write_batch(batch)
    out["arrow_file"] = root / "file.arrow"
    with pa.OSFile(str(root / "stream.arrow"), "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
        writer.write_table(table, max_chunksize=11)
    out["arrow_stream"] = root / "stream.arrow"
    pa_feather.write_feather(table, str(root / "r.feather"), chunksize=13)  # an IPC file, lz4-compressed buffers
    out["feather"] = root / "r.feather"
    loaded = datasets.Dataset.from_json(str(out["jsonl"]), cache_dir=str(root / "hf-cache"))  # `datasets`' json loader
    loaded.save_to_disk(str(root / "json_saved"), num_shards=2)
    out["json_loader_save_to_disk"] = root / "json_saved"
    loaded.to_parquet(str(root / "json_loaded.parquet"))
    out["json_loader_parquet"] = root / "json_loaded.parquet"
    return out


def _hub_cache(cache: Path, name: str, files: dict[str, bytes], rev: str = "0f1e2d3c") -> Path:
    """A hub cache laid out as huggingface_hub writes it: snapshot files are links to blobs."""
    return hub_repo(cache, "datasets", name, files, rev) / "snapshots" / rev


@pytest.mark.parametrize(
    ("fmt", "make", "flags"),
    [("text", _text_rows, ()), ("chat", _chat_rows, ("--format", "chat")),
     ("sharegpt", _sharegpt_rows, ("--format", "sharegpt")), ("alpaca", _alpaca_rows, ("--format", "alpaca"))],
)
def test_every_source_gives_the_same_bytes(tmp_path: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                           fmt: str, make: object, flags: tuple[str, ...]) -> None:
    rows = make(60, seed=5)  # type: ignore[operator]
    sources = _write_sources(tmp_path / "src", rows)
    cache = tmp_path / "hub"
    snapshot = _hub_cache(cache, "acme/talks", {"data/train-00000-of-00001.json": sources["json"].read_bytes(),
                                                 "data/test-00000-of-00001.json": b'[{"text": "held out"}]',
                                                 "README.md": b"# talks"})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    reference = _tokenize([sources["jsonl"]], bpe_tokenizer_dir, tmp_path / "ref", "--workers", "1", *flags)
    for kind, path in sources.items():
        for workers in ("1", "2"):
            out = _tokenize([path], bpe_tokenizer_dir, tmp_path / f"{kind}-{workers}", "--workers", workers,
                            "--chunk-bytes", "700", *flags)
            _same_bytes(reference, out)
    hub = _tokenize(["hf://datasets/acme/talks"], bpe_tokenizer_dir, tmp_path / "hub-store", "--chunk-bytes", "700", *flags)
    _same_bytes(reference, hub)
    entry = packtool.formats.token_store.open_token_store(hub).manifest["hub"][0]  # offline, a hand-built cache:
    assert entry["commit"] == snapshot.name and entry["cache_trusted"] is True  # read as is, and said so
    manifest = packtool.formats.token_store.open_token_store(hub).manifest
    assert [s["path"] for s in manifest["sources"]] == [str(snapshot / "data" / "train-00000-of-00001.json")]
    assert manifest["sources"][0]["records"] == len(rows)
    saved = packtool.formats.token_store.open_token_store(tmp_path / "save_to_disk-1").manifest["sources"]
    assert [Path(s["path"]).name for s in saved] == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert sum(s["records"] for s in saved) == len(rows) and all(len(s["sha256"]) == 64 for s in saved)


def test_json_array_chunks_are_element_aligned_across_block_boundaries(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _text_rows(200, seed=2)
    path = tmp_path / "a.json"
    path.write_text("\ufeff  " + json.dumps(rows, indent=2, ensure_ascii=False), encoding="utf-8")
    for block in (5, 64, 1 << 22):  # elements, strings and escapes cut by block boundaries
        monkeypatch.setattr(jsonarray, "_BLOCK", block)
        monkeypatch.setattr(streams, "_BLOCK", block)
        for chunk_bytes in (1, 333, 5000, 1 << 30):
            sources, chunks = plan_chunks([path], chunk_bytes)
            assert sources[0].n_bytes == path.stat().st_size
            records = [r for c in chunks for r in read_chunk(c)]
            assert [r.value for r in records] == rows
            assert [r.line for r in records] == list(range(len(rows)))  # the 0-based index
            assert [c.first_line for c in chunks] == sorted({c.first_line for c in chunks})
            if chunk_bytes == 1:
                assert len(chunks) == len(rows)


def test_json_array_is_streamed_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    row = json.dumps({"text": "w " * 200, "meta": {"tags": ["a", "b"]}})
    n = 60_000  # ~25 MB: six 4 MiB blocks
    with open(path, "w") as fh:
        fh.write("[")
        fh.write(",\n".join([row] * n))
        fh.write("]")
    size = path.stat().st_size
    _, chunks = plan_chunks([path], 1 << 40)
    assert len(chunks) == 1
    tracemalloc.start()
    try:
        records = read_chunk(chunks[0])
        first = next(records)
        _, peak_first = tracemalloc.get_traced_memory()
        count = 1 + sum(1 for _ in records)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.value == json.loads(row) and count == n
    assert peak_first < size / 3  # the first record comes before the file is read
    assert peak < size / 2  # about one block (4 MiB) + one element, not the file


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'[{"text": "a"}, {"text": "b"', "the JSON array is truncated: the file ends inside element 1"),
        (b'[{"text": "a"}, {"text": "b', "truncated: the file ends inside a string"),
        (b'"text"', "not a JSON array"),
        (b'[{"text": "a"}] [', "unexpected data after the JSON array's end, at byte 16"),
        (b'[{"text": "a"}}, {"text": "b"}]', "unmatched '}'"),
        (b"  \n", "the file is empty"),
    ],
)
def test_broken_json_array_is_a_file_error(tmp_path: Path, bpe_tokenizer_dir: Path, data: bytes, message: str) -> None:
    (tmp_path / "in.json").write_bytes(data)
    args = ["tokenize", str(tmp_path / "in.json"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s")]
    for extra in ((), ("--on-error", "skip")):  # a broken file is an error even in skip mode
        err = cli_error(*args, *extra)
        assert message in err and "in.json" in err, err
    assert not (tmp_path / "s").exists()


def test_bad_json_array_elements_are_records_addressed_by_index(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    good = [{"text": t} for t in zipf_texts(6, seed=1)]
    body = ", ".join(json.dumps(r) for r in good[:3]) + ', {"text": tru}, , {"body": "x"}, ' + ", ".join(
        json.dumps(r) for r in good[3:]
    )
    (tmp_path / "in.json").write_text(f"[{body}]")
    args = ["tokenize", str(tmp_path / "in.json"), "--tokenizer", str(bpe_tokenizer_dir), "--chunk-bytes", "40"]
    err = cli_error(*args, "--output", str(tmp_path / "f"))
    assert "malformed JSON" in err and "(record 3 of the JSON array, 0-based)" in err and "in.json:3" in err
    out = _tokenize([], bpe_tokenizer_dir, tmp_path / "s", *args[1:2], "--chunk-bytes", "40", "--on-error", "skip")
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert all(r["line"] == r["record"] for r in rejects)  # SPEC's `line` key, the index also as `record`
    assert [(r["record"], r["reason"].split(" (")[0]) for r in rejects] == [
        (3, "malformed JSON"),
        (4, "empty element"),
        (5, "missing field 'text'"),
    ]
    reference = _tokenize([write_jsonl(tmp_path / "good.jsonl", good)], bpe_tokenizer_dir, tmp_path / "ref")
    _same_bytes(reference, out)
    source = packtool.formats.token_store.open_token_store(out).manifest["sources"][0]
    assert (source["records"], source["documents"], source["rejected"]) == (9, 6, 3)


def test_json_lines_named_json_and_empty_array(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    rows = [{"text": t} for t in zipf_texts(20, seed=4)]
    write_jsonl(tmp_path / "lines.json", rows)  # what many hub datasets call .json
    (tmp_path / "empty.json").write_text("[" + " \n" * 6000 + "]")  # blank far past any read-ahead: still empty
    reference = _tokenize([write_jsonl(tmp_path / "r.jsonl", rows)], bpe_tokenizer_dir, tmp_path / "ref")
    out = _tokenize([tmp_path / "lines.json", tmp_path / "empty.json"], bpe_tokenizer_dir, tmp_path / "s")
    _same_bytes(reference, out)
    sources = packtool.formats.token_store.open_token_store(out).manifest["sources"]
    assert [(Path(s["path"]).name, s["records"]) for s in sources] == [("empty.json", 0), ("lines.json", 20)]


def test_directory_walk_reads_saved_datasets_whole_and_skips_metadata_json(tmp_path: Path) -> None:
    rows = _text_rows(10, seed=3)
    root = tmp_path / "in"
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "b_saved"), num_shards=2)
    write_jsonl(root / "a.jsonl", rows)
    (root / "c.json").write_text(json.dumps(rows))
    (root / "tok").mkdir()
    (root / "tok" / "tokenizer.json").write_text("{}")
    (root / "config.json").write_text("{}")
    got = expand_inputs([str(root)])
    assert [p.relative_to(root).as_posix() for p in got] == [
        "a.jsonl", "b_saved/data-00000-of-00002.arrow", "b_saved/data-00001-of-00002.arrow", "c.json"]
    assert expand_inputs([str(root / "b_saved")]) == got[1:3] == expand_inputs([str(root / "b_*")])


def test_saved_dataset_keeps_state_json_order(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_list(_text_rows(12, seed=6))
    ds.save_to_disk(str(tmp_path / "d"), num_shards=3)
    state = json.loads((tmp_path / "d" / "state.json").read_text())
    state["_data_files"].reverse()  # as a concatenation could list them
    (tmp_path / "d" / "state.json").write_text(json.dumps(state))
    got = expand_inputs([str(tmp_path / "d")])
    assert [p.name for p in got] == [f["filename"] for f in state["_data_files"]]


def test_dataset_dict_asks_for_a_split(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ds = datasets.Dataset.from_list(_text_rows(8, seed=1))
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    err = cli_error("tokenize", str(tmp_path / "dd"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"))
    assert "DatasetDict" in err and "train, test" in err and str(tmp_path / "dd" / "train") in err
    out = _tokenize([tmp_path / "dd" / "train"], bpe_tokenizer_dir, tmp_path / "s")
    assert packtool.formats.token_store.open_token_store(out).manifest["n_documents"] == 11


def test_feather_v1_is_named_not_read_as_a_broken_ipc_file(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    table = pa.table({"text": ["one document", "another"]})
    pa_feather.write_feather(table, str(tmp_path / "v2.feather"))  # V2, the default: an Arrow IPC file
    _same_bytes(_tokenize([write_jsonl(tmp_path / "r.jsonl", table.to_pylist())], bpe_tokenizer_dir, tmp_path / "j"),
                _tokenize([tmp_path / "v2.feather"], bpe_tokenizer_dir, tmp_path / "f"))
    with pytest.warns(DeprecationWarning):
        pa_feather.write_feather(table, str(tmp_path / "v1.feather"), version=1)
    err = cli_error("tokenize", str(tmp_path / "v1.feather"), "--tokenizer", str(bpe_tokenizer_dir),
                    "--output", str(tmp_path / "s"))
    assert "Feather V1" in err and "write_feather" in err and "v1.feather" in err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("layout", ["stream", "file", "saved"])
def test_truncated_arrow_is_a_file_error(tmp_path: Path, bpe_tokenizer_dir: Path, layout: str) -> None:
    ds = datasets.Dataset.from_list(_text_rows(300, seed=8))
    if layout == "saved":
        ds.save_to_disk(str(tmp_path / "in"))
        path = tmp_path / "in" / "data-00000-of-00001.arrow"
        target = tmp_path / "in"
    else:
        path = target = tmp_path / "in.arrow"
        table = ds.data.table
        new = pa.ipc.new_stream if layout == "stream" else pa.ipc.new_file
        with pa.OSFile(str(path), "wb") as fh, new(fh, table.schema) as writer:
            writer.write_table(table, max_chunksize=50)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    err = cli_error("tokenize", str(target), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"),
                    "--on-error", "skip")
    assert "cannot read Arrow data" in err and path.name in err and "complete Arrow" in err
    path.write_bytes(b"garbage" * 10)
    assert "cannot read Arrow data" in cli_error("tokenize", str(target), "--tokenizer", str(bpe_tokenizer_dir),
                                                 "--output", str(tmp_path / "s"))
    assert not (tmp_path / "s").exists()


def test_arrow_rows_over_the_record_limit_and_nested_fields(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    rows = [{"doc": {"body": t}} for t in ["short", "x" * 5000, "fine too"]]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "d"))
    out = _tokenize([tmp_path / "d"], bpe_tokenizer_dir, tmp_path / "s", "--field", "doc.body",
                    "--max-record-bytes", "1000", "--on-error", "skip")
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], "over --max-record-bytes 1000" in r["reason"]) for r in rejects] == [(2, True)]
    assert packtool.formats.token_store.open_token_store(out).manifest["n_documents"] == 2


def test_hub_dataset_paths_globs_and_missing(tmp_path: Path, bpe_tokenizer_dir: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _text_rows(30, seed=9)
    table = pa.Table.from_pylist(rows)
    pq.write_table(table.slice(0, 10), tmp_path / "a.parquet")
    pq.write_table(table.slice(10), tmp_path / "b.parquet")
    cache = tmp_path / "home" / "hub"
    _hub_cache(cache, "org/ds", {"data/train-00000-of-00002.parquet": (tmp_path / "a.parquet").read_bytes(),
                                 "data/train-00001-of-00002.parquet": (tmp_path / "b.parquet").read_bytes(),
                                 "extra/notes.jsonl": b'{"text": "not the train split"}\n',
                                 ".gitattributes": b"*.parquet filter=lfs"})
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))  # HF_HOME/hub, as huggingface_hub does
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    reference = _tokenize([write_jsonl(tmp_path / "r.jsonl", rows)], bpe_tokenizer_dir, tmp_path / "ref")
    for spec in ("hf://datasets/org/ds", "hf://datasets/org/ds/data", "hf://datasets/org/ds/data/train-*.parquet"):
        out = _tokenize([spec], bpe_tokenizer_dir, tmp_path / "s", "--overwrite", "--workers", "2", "--chunk-bytes", "1")
        _same_bytes(reference, out)
    notes = _tokenize(["hf://datasets/org/ds/extra/notes.jsonl"], bpe_tokenizer_dir, tmp_path / "n")
    assert packtool.formats.token_store.open_token_store(notes).manifest["n_documents"] == 1
    base = ("--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "x"))
    err = cli_error("tokenize", "hf://datasets/org/absent", *base)
    assert "org/absent is not in the local Hugging Face cache" in err and "hf download org/absent --repo-type dataset" in err
    assert str(cache) in err
    assert "holds no" in cli_error("tokenize", "hf://datasets/org/ds/nothing-*.jsonl", *base)
    assert "hf://datasets/ORG/NAME" in cli_error("tokenize", "hf://models/org/ds", *base)


def test_hub_dataset_saved_to_disk_in_the_snapshot(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _chat_rows(20, seed=4)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    files = {f"saved/{p.name}": p.read_bytes() for p in (tmp_path / "saved").iterdir()}
    _hub_cache(tmp_path / "cache", "org/chat", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    reference = _tokenize([write_jsonl(tmp_path / "r.jsonl", rows)], bpe_tokenizer_dir, tmp_path / "ref", "--format", "chat")
    out = _tokenize(["hf://datasets/org/chat"], bpe_tokenizer_dir, tmp_path / "s", "--format", "chat")
    _same_bytes(reference, out)


@pytest.mark.parametrize("kind", ["json", "save_to_disk"])
def test_interrupted_run_resumes_with_the_same_bytes(tmp_path: Path, bpe_tokenizer_dir: Path, kind: str) -> None:
    path = _write_sources(tmp_path / "src", _text_rows(400, seed=12))[kind]
    check_resume(path, bpe_tokenizer_dir, tmp_path, chunk_bytes=4000)


def test_expand_rejects_unknown_hub_scheme_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="hf://datasets/ORG/NAME"):
        expand_inputs(["hf://datasets/only-org"])


def test_symlink_named_otherwise_than_its_target_is_read_by_its_name(tmp_path: Path) -> None:
    (tmp_path / "blob0001").write_text('[{"text": "a"}, {"text": "b"}]')
    (tmp_path / "data.json").symlink_to(tmp_path / "blob0001")
    paths = expand_inputs([str(tmp_path / "data.json")])
    assert paths == [tmp_path.resolve() / "data.json"]
    _, chunks = plan_chunks(paths, 1 << 20)
    assert [r.value for c in chunks for r in read_chunk(c)] == [{"text": "a"}, {"text": "b"}]


def test_run_yaml_keeps_hub_inputs_and_resolves_paths(tmp_path: Path) -> None:
    from packtool.cli.runconfig import load_run_config

    (tmp_path / "run.yaml").write_text(
        "tokenize: {inputs: [hf://datasets/org/ds/data/*.json, local.json], tokenizer: org/tok, output: out}\n"
    )
    step = load_run_config(tmp_path / "run.yaml")[0]
    assert step.tokenize is not None
    assert step.tokenize.inputs == ("hf://datasets/org/ds/data/*.json", str(tmp_path / "local.json"))


def test_json_array_elements_over_the_limit_are_skipped_unread_across_blocks(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"text": "x" * n} for n in (10, 300, 20, 1000, 5)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(rows))
    monkeypatch.setattr(streams, "_BLOCK", 64)
    _, chunks = plan_chunks([path], 1 << 20)
    got = [r for c in chunks for r in read_chunk(c, max_record_bytes=100)]
    assert [r.line for r in got] == [0, 1, 2, 3, 4]
    assert [r.value for r in got if r.error is None] == [rows[0], rows[2], rows[4]]
    assert [r.error.split(",")[0] for r in got if r.error] == ["record is 313 bytes", "record is 1013 bytes"]  # with the blank after the comma


@pytest.mark.parametrize(("damage", "message"), [("state", "cannot read the file list"), ("shard", "no such Arrow file")])
def test_incomplete_saved_dataset_is_an_error(tmp_path: Path, bpe_tokenizer_dir: Path, damage: str, message: str) -> None:
    datasets.Dataset.from_list(_text_rows(10, seed=2)).save_to_disk(str(tmp_path / "d"), num_shards=2)
    if damage == "state":
        (tmp_path / "d" / "state.json").write_text('{"_data_files": "nope"')
    else:
        (tmp_path / "d" / "data-00001-of-00002.arrow").unlink()
    err = cli_error("tokenize", str(tmp_path / "d"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"))
    assert message in err and str(tmp_path / "d") in err and "save_to_disk" in err


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(alphabet=st.sampled_from('ab"\\\\[]{},: \n\té🙂')),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_JSON, max_size=12), indent=st.sampled_from([None, 1]), block=st.integers(1, 40),
       chunk_bytes=st.integers(1, 200))
def test_json_array_reader_matches_json_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: list[object],
                                              indent: int | None, block: int, chunk_bytes: int) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(values, indent=indent, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(jsonarray, "_BLOCK", block)
    monkeypatch.setattr(streams, "_BLOCK", block)
    _, chunks = plan_chunks([path], chunk_bytes)
    records = [r for c in chunks for r in read_chunk(c)]
    assert [r.error for r in records] == [None] * len(values)
    assert [r.value for r in records] == values and [r.line for r in records] == list(range(len(values)))


def test_a_json_file_holding_one_object_over_several_lines_is_refused_at_file_level(
    tmp_path: Path, bpe_tokenizer_dir: Path
) -> None:
    """A `.json` that is one pretty-printed object (records under a key, as some exports are) is not JSON Lines:
    one file-level line naming what it holds, not a malformed-JSON error at line 1 (or every line a reject with
    --on-error skip). JSON Lines named `.json`, a one-line object and broken JSON Lines keep their own paths."""
    rows = [{"text": t} for t in zipf_texts(20, seed=3)]
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"version": 2, "data": rows}, indent=2))
    for extra in ((), ("--on-error", "skip")):
        line = cli_error("tokenize", str(nested), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                         str(tmp_path / "n"), *extra)
        assert "one JSON object spread over several lines" in line and "'data'" in line and str(nested) in line
    assert not (tmp_path / "n").exists()
    record = tmp_path / "record.json"  # one record pretty-printed: refused too, with no key to name
    record.write_text(json.dumps(rows[0], indent=2))
    line = cli_error("tokenize", str(record), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "r"))
    assert "one JSON object spread over several lines, not JSON Lines" in line
    lines = tmp_path / "lines.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one = tmp_path / "one.json"
    one.write_text(json.dumps(rows[0]))
    for path, docs in ((lines, 20), (one, 1)):
        code, out, err = cli("tokenize", str(path), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                             str(tmp_path / path.stem), "-q")
        assert code == 0 and out.startswith(f"tokenized {docs} documents"), (out, err)
    broken = tmp_path / "broken.json"
    broken.write_text('{"text": "a"\n{"text": "b"}\n')
    line = cli_error("tokenize", str(broken), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "b"))
    assert f"{broken}:1" in line


def test_hub_dataset_at_a_revision(tmp_path: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hf://datasets/ORG/NAME@REV[/PATH]`: a branch or tag recorded under refs/, or a commit hash, picks its own
    snapshot (never refs/main's in its place); a revision the cache does not hold names the command with
    --revision; `..` in a revision cannot leave the cache."""
    old, new = _text_rows(12, seed=4), _text_rows(20, seed=5)
    cache = tmp_path / "hub"
    _hub_cache(cache, "org/ds", {"data.jsonl": "".join(json.dumps(r) + "\n" for r in new).encode()}, rev="c" * 40)
    repo = cache / "datasets--org--ds"
    v1 = repo / "snapshots" / ("a" * 40)
    v1.mkdir(parents=True)
    write_jsonl(v1 / "data.jsonl", old)
    (repo / "refs" / "v1.0").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    want_old = _tokenize([write_jsonl(tmp_path / "old.jsonl", old)], bpe_tokenizer_dir, tmp_path / "ro")
    want_new = _tokenize([write_jsonl(tmp_path / "new.jsonl", new)], bpe_tokenizer_dir, tmp_path / "rn")
    for spec, want in (("hf://datasets/org/ds", want_new), ("hf://datasets/org/ds@main", want_new),
                       ("hf://datasets/org/ds@v1.0", want_old), (f"hf://datasets/org/ds@{'a' * 40}/data.jsonl", want_old)):
        _same_bytes(want, _tokenize([spec], bpe_tokenizer_dir, tmp_path / "s", "--overwrite"))
    base = ("--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "x"))
    err = cli_error("tokenize", "hf://datasets/org/ds@v2.0", *base)
    assert "org/ds at revision 'v2.0' is not in the local Hugging Face cache" in err
    assert "hf download org/ds --repo-type dataset --revision v2.0" in err
    assert "is not in the local" in cli_error("tokenize", "hf://datasets/org/ds@../../datasets--org--ds/refs", *base)
    assert "@REVISION" in cli_error("tokenize", "hf://datasets/org/ds@", *base)
    assert not (tmp_path / "x").exists()
