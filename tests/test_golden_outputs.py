"""Golden outputs: the stores, packs and exports of a fixed corpus, for every record shape and every source.

The corpus (tests/golden/corpus: records of each shape, a few bad ones among them, and a frozen
byte-level BPE tokenizer with Qwen2.5's real chat template) is written as every source kind packtool
reads, tokenized through the CLI, packed with every algorithm and a mixture with a validation split,
and exported to every trainer. The sha256 of every data file must equal tests/golden/outputs.json,
recorded before the tokenize and export rooms were restructured: a refactor that changes one byte
of any output fails here. Regenerate only for a deliberate format change:
`PACKTOOL_WRITE_GOLDEN=1 pytest tests/test_golden_outputs.py` (and say why in CHANGELOG.md).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.feather as pa_feather
import pyarrow.parquet as pq
import pytest
import zstandard
from support import build_big_vocab_tokenizer, cli

GOLDEN = Path(__file__).parent / "golden"
CORPUS = GOLDEN / "corpus"
EXPECTED = GOLDEN / "outputs.json"
WRITE = os.environ.get("PACKTOOL_WRITE_GOLDEN") == "1"

#: shape -> (corpus file, flags)
SHAPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "text": ("text.jsonl", ("--format", "text")),
    "prompt_completion": ("prompt_completion.jsonl", ("--format", "prompt-completion")),
    "conversational": ("conversational.jsonl", ("--format", "prompt-completion")),
    "chat": ("chat.jsonl", ("--format", "chat")),
    "sharegpt": ("sharegpt.jsonl", ("--format", "sharegpt")),
    "alpaca": ("alpaca.jsonl", ("--format", "alpaca")),
}
STORE_FILES = ("tokens.bin", "tokens.boundaries", "tokens.loss")
#: bad lines only jsonl can hold: they must be rejected and leave the store unchanged
BAD_LINES = b'{"text": 5}\n{"text": "unterminated\n\xff\xfe{"text": "bad utf-8"}\n\n   \n'


def _rows(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (CORPUS / name).read_text(encoding="utf-8").splitlines()]


def _write_sources(root: Path, name: str, shape: str) -> dict[str, Path]:
    """The corpus file as every source kind packtool reads (same records, same order)."""
    rows = _rows(name)
    raw = (CORPUS / name).read_bytes()
    root.mkdir(parents=True)
    out: dict[str, Path] = {}
    out["jsonl"] = root / "r.jsonl"
    out["jsonl"].write_bytes(raw)
    out["jsonl.gz"] = root / "r.jsonl.gz"
    out["jsonl.gz"].write_bytes(gzip.compress(raw, mtime=0))
    out["jsonl.zst"] = root / "r.jsonl.zst"
    out["jsonl.zst"].write_bytes(zstandard.ZstdCompressor().compress(raw))
    out["json_lines_named_json"] = root / "lines.json"
    out["json_lines_named_json"].write_bytes(raw)
    out["json_array"] = root / "array.json"
    out["json_array"].write_text(json.dumps(rows, indent=1, ensure_ascii=False), encoding="utf-8")
    table = pa.Table.from_pylist(rows)
    out["parquet"] = root / "r.parquet"
    pq.write_table(table, out["parquet"], row_group_size=7)
    out["arrow_file"] = root / "file.arrow"
    with pa.OSFile(str(out["arrow_file"]), "wb") as fh, pa.ipc.new_file(fh, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=9):
            writer.write_batch(batch)
    out["arrow_stream"] = root / "stream.arrow"
    with pa.OSFile(str(out["arrow_stream"]), "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
        writer.write_table(table, max_chunksize=11)
    out["feather"] = root / "r.feather"
    pa_feather.write_feather(table, str(out["feather"]), chunksize=13)
    out["save_to_disk"] = root / "saved"
    datasets.disable_progress_bars()
    datasets.Dataset(table).save_to_disk(str(out["save_to_disk"]), num_shards=3)
    split = root / "split"
    split.mkdir()
    half = len(raw.splitlines(keepends=True)) // 2
    lines = raw.splitlines(keepends=True)
    (split / "part-0.jsonl").write_bytes(b"".join(lines[:half]))
    (split / "part-1.jsonl.gz").write_bytes(gzip.compress(b"".join(lines[half:]), mtime=0))
    out["directory"] = split
    if shape == "text":  # one .txt document per file: the records that have a string text
        texts = [r["text"] for r in rows if isinstance(r.get("text"), str)]
        docs = root / "docs"
        docs.mkdir()
        for i, text in enumerate(texts):
            (docs / f"{i:03d}.txt").write_text(text, encoding="utf-8", newline="")
        out["txt_files"] = docs
    return out


def _hub_snapshot(cache: Path, data: bytes) -> str:
    """A hub cache as huggingface_hub lays it out: snapshot files link to blobs; a held-out test split beside."""
    repo = cache / "datasets--acme--golden"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    files = {"data/train-00000-of-00001.jsonl": data, "data/test-00000-of-00001.jsonl": b'{"text": "held out"}\n',
             "README.md": b"# golden"}
    for i, (rel, content) in enumerate(sorted(files.items())):
        blob = repo / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = repo / "snapshots" / "0123abcd" / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    return "hf://datasets/acme/golden"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _store_digest(store: Path) -> dict[str, str]:
    return {name: _sha(store / name) if (store / name).is_file() else "absent" for name in STORE_FILES}


def _rejects_digest(store: Path) -> str:
    """rejects.jsonl with each source reduced to its file name (the rest: line and reason, as written)."""
    path = store / "rejects.jsonl"
    if not path.is_file():
        return "absent"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        row["source"] = Path(row["source"]).name
    return hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _tokenize(inputs: list[str], tokenizer: Path, out: Path, *flags: str) -> Path:
    code, _, err = cli("tokenize", *inputs, "--tokenizer", str(tokenizer), "--output", str(out), "-q",
                       "--on-error", "skip", *flags)
    assert code == 0, err
    return out


def _pack(stores: list[str], out: Path, *flags: str) -> Path:
    code, _, err = cli("pack", *stores, "--output", str(out), "-q", *flags)
    assert code == 0, err
    return out


_BUILD = re.compile(r"\.[0-9a-f]{16}\.")


def _pack_digest(root: Path) -> dict[str, str]:
    """Every pack data file by its name without the build id (the metadata line is not data: it names paths)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.npy")):
        if path.is_file():
            out[_BUILD.sub(".", path.name)] = _sha(path)
    assert out, f"no pack files under {root}"
    return out


def _export_digest(out: Path) -> dict[str, str]:
    """Each exported data file's content (parquet by its columns' values: the file bytes name the writer)."""
    digest: dict[str, str] = {}
    for path in sorted(out.iterdir()):
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            payload = json.dumps({c: table.column(c).to_pylist() for c in table.column_names}).encode()
            digest[path.name] = hashlib.sha256(payload).hexdigest()
        elif path.suffix == ".npy":
            with path.open("rb") as fh:
                is_npy = fh.read(6) == b"\x93NUMPY"  # OLMo-core's files are raw memmaps named .npy
            array = np.load(path, allow_pickle=True) if is_npy else None  # nemo: an object array of dicts
            if array is not None and array.dtype == object:
                items = [{k: np.asarray(v).tolist() for k, v in item.items()} for item in array.tolist()]
                digest[path.name] = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()
            else:
                digest[path.name] = _sha(path)
    assert digest, f"no exported data files in {out}"
    return digest


@pytest.fixture(scope="module")
def golden_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Run everything once; yield {case: digest} and (when writing) store it as the new golden file."""
    tmp = tmp_path_factory.mktemp("golden")
    tok = tmp / "tok"
    shutil.copytree(CORPUS / "tokenizer", tok)
    got: dict[str, object] = {}
    stores: dict[str, Path] = {}
    mp = pytest.MonkeyPatch()
    try:
        for shape, (name, flags) in SHAPES.items():
            sources = _write_sources(tmp / "src" / shape, name, shape)
            cache = tmp / f"hub-{shape}"
            mp.setenv("HF_HUB_CACHE", str(cache))
            mp.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: online, the hub is asked for the file list
            inputs: dict[str, list[str]] = {kind: [str(p)] for kind, p in sources.items()}
            inputs["hub"] = [_hub_snapshot(cache, (CORPUS / name).read_bytes())]
            for kind, given in inputs.items():
                extra = ("--chunk-bytes", "900", "--workers", "2") if kind != "jsonl" else ("--workers", "1")
                store = _tokenize(given, tok, tmp / "stores" / shape / kind, *flags, *extra)
                got[f"tokenize/{shape}/{kind}"] = _store_digest(store)
            stores[shape] = tmp / "stores" / shape / "jsonl"
            got[f"rejects/{shape}"] = _rejects_digest(stores[shape])
            auto = _tokenize([str(sources["jsonl"])], tok, tmp / "stores" / shape / "auto", "--format", "auto")
            got[f"tokenize/{shape}/auto"] = _store_digest(auto)
        text_src = tmp / "src" / "text"
        txt = _tokenize([str(text_src / "docs")], tok, tmp / "stores" / "txt-files")
        got["tokenize/text/txt_files"] = _store_digest(txt)
        sep = text_src / "joined.txt"
        sep.write_text("\n@@\n".join(r["text"] for r in _rows("text.jsonl") if isinstance(r.get("text"), str)),
                       encoding="utf-8")
        got["tokenize/text/txt_separator"] = _store_digest(_tokenize([str(sep)], tok, tmp / "stores" / "txt-sep",
                                                                     "--separator", "\n@@\n"))
        bad = text_src / "bad.jsonl"
        bad.write_bytes((CORPUS / "text.jsonl").read_bytes() + BAD_LINES)
        bad_store = _tokenize([str(bad)], tok, tmp / "stores" / "text-bad")
        got["tokenize/text/jsonl_with_bad_lines"] = _store_digest(bad_store)
        got["rejects/text_with_bad_lines"] = _rejects_digest(bad_store)
        variants = {
            "text_no_eos": ("text.jsonl", ("--no-eos",)),
            "text_bos": ("text.jsonl", ("--bos",)),
            "text_nested_field": ("text.jsonl", ("--field", "meta.body")),
            "chat_last_turn": ("chat.jsonl", ("--format", "chat", "--assistant-turns", "last")),
            "chat_role_map": ("chat.jsonl", ("--format", "chat", "--role-map", "system=user")),
            "sharegpt_role_map": ("sharegpt.jsonl", ("--format", "sharegpt", "--role-map", "alien=user")),
            "alpaca_fields": ("alpaca.jsonl", ("--format", "alpaca", "--input-field", "output",
                                               "--output-field", "instruction")),
            "pc_fields": ("prompt_completion.jsonl", ("--format", "prompt-completion", "--prompt-field", "completion",
                                                      "--completion-field", "prompt")),
        }
        for case, (name, flags) in variants.items():
            store = _tokenize([str(CORPUS / name)], tok, tmp / "stores" / case, *flags)
            got[f"tokenize/{case}"] = _store_digest(store)
        big = build_big_vocab_tokenizer(tmp / "big_tok")
        stores["u32"] = _tokenize([str(CORPUS / "u32.jsonl")], big, tmp / "stores" / "u32")
        got["tokenize/u32"] = _store_digest(stores["u32"])

        packs = tmp / "packs"
        for algorithm in ("ffd", "bfd", "mffd", "ffs", "concat"):
            got[f"pack/text/{algorithm}"] = _pack_digest(_pack([str(stores["text"])], packs / algorithm, "--size", "64",
                                                               "--algorithm", algorithm, "--seed", "3"))
        got["pack/text/flags"] = _pack_digest(_pack([str(stores["text"])], packs / "flags", "--size", "64",
                                                     "--validation", "0.2", "--pad-multiple", "8",
                                                     "--max-docs-per-pack", "3", "--overlong", "truncate"))
        # integer weights: a fractional subset is seeded by the store manifest, which names the tmp paths
        got["pack/mixture"] = _pack_digest(_pack([f"{stores['text']}:2", str(stores["prompt_completion"]),
                                                  f"{stores['conversational']}:3"], packs / "mixture", "--size", "128",
                                                 "--validation", "0.1"))
        chat_pack = _pack([str(stores["chat"])], packs / "chat", "--size", "512", "--overlong", "drop", "--no-shuffle")
        got["pack/chat"] = _pack_digest(chat_pack)
        for shape in ("sharegpt", "alpaca"):
            got[f"pack/{shape}"] = _pack_digest(_pack([str(stores[shape])], packs / shape, "--size", "256",
                                                      "--algorithm", "mffd"))
        got["pack/u32"] = _pack_digest(_pack([str(stores["u32"])], packs / "u32", "--size", "64"))
        for target in ("megatron-bridge", "nemo", "trl", "olmo-core"):
            out = tmp / "exports" / target
            source = packs / "bfd" if target == "olmo-core" else chat_pack  # OLMo-core finds documents by EOS
            code, _, err = cli("export", str(source), "--to", target, "--output", str(out), "-q")
            assert code == 0, err
            got[f"export/{target}"] = _export_digest(out)
    finally:
        mp.undo()
    if WRITE:
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    yield got


def test_every_output_equals_the_golden_file(golden_run: dict[str, object]) -> None:
    expected = json.loads(EXPECTED.read_text())
    assert sorted(golden_run) == sorted(expected), "cases differ from tests/golden/outputs.json"
    wrong = [case for case in expected if golden_run[case] != expected[case]]
    assert not wrong, f"outputs changed for {wrong}"


def test_every_source_of_a_shape_gives_one_store(golden_run: dict[str, object]) -> None:
    """Not only equal to the recording: the sources agree with each other (and auto with the named format)."""
    for shape in SHAPES:
        digests = {case: d for case, d in golden_run.items() if case.startswith(f"tokenize/{shape}/")
                   and case != "tokenize/text/txt_separator"}
        assert len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1, (shape, digests)
    assert golden_run["tokenize/text/txt_separator"] == golden_run["tokenize/text/jsonl"]
    for shape in ("prompt_completion", "chat", "sharegpt", "alpaca"):
        assert golden_run[f"tokenize/{shape}/jsonl"]["tokens.loss"] != "absent", shape  # type: ignore[index]
    assert golden_run["rejects/text"] != "absent" and golden_run["rejects/text_with_bad_lines"] != golden_run["rejects/text"]
