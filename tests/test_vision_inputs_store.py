"""`packtool tokenize` of records with images into a self-contained token store (issue 37, section 3), end to end
through the CLI: each image occurrence is a row of the store's media table at the offset of its first image
token, each unique image held once; `--workers`, shards + `merge` and kill + resume give the same bytes; a
missing, escaping, remote or miscounted image fails the run in one line (exit 1, nothing written).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from support import cli, cli_error
from test_vision_families import build_qwen_folder

from packtool.exec.local import process_executor as local_executor
from packtool.formats.token_store import open_token_store
from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus
from packtool.stages.tokenize.chunks import ChunkTask
from packtool.stages.tokenize.journal import ChunkResult

pytest.importorskip("packtool.formats.media")  # the store's media files (vpack's formats/media.py)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "vision"
CHUNK = 1500  # bytes: the corpus below becomes several chunks


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision_store")
    folder = build_qwen_folder(root / "model", "qwen2_vl")
    shutil.copytree(SAMPLE, root / "vision")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    text_only = {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there."}]}
    rows = [*demo, text_only, *demo[::-1], text_only, *demo]
    src = root / "vision" / "corpus.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {"root": root, "model": folder, "src": src}


def args(world: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["tokenize", str(world["src"]), "--tokenizer", str(world["model"]), "--output", str(out),
            "--format", "auto", "--chunk-bytes", str(CHUNK), "--backend", "hf", "-q", *extra]


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def single(world: dict[str, Path]) -> Path:
    out = world["root"] / "single"
    code, _, err = cli(*args(world, out, "--workers", "1"))
    assert code == 0, err
    return out


def test_the_store_holds_every_image_once_beside_its_rows(world: dict[str, Path], single: Path) -> None:
    store = open_token_store(single, check_hashes=True)
    manifest = json.loads((single / "manifest.json").read_text())
    vision = manifest["vision"]
    assert vision["family"] == "qwen2_vl" and vision["processor"]["family"] == "qwen2_vl"
    assert store.n_documents == 20
    media = store.media
    assert media is not None
    per_record = [len(r["images"]) for r in json.loads((SAMPLE / "mllm_demo.json").read_text())]
    counts = [*per_record, 0, *per_record[::-1], 0, *per_record]
    assert np.bincount(media.doc, minlength=20).tolist() == counts
    assert vision["n_images"] == sum(counts) and vision["n_unique"] == 3
    ids, bounds = store.tokens, store.boundaries
    starts = np.r_[0, bounds[:-1]] if bounds[0] != 0 else bounds[:-1]
    token = vision["image_token_id"]
    for i in range(len(media)):
        at = int(starts[media.doc[i]] + media.offset[i])
        n = int(media.n_tokens[i])
        assert (ids[at: at + n] == token).all() and ids[at - 1] != token and ids[at + n] != token
        assert store.loss is not None and not store.loss[at: at + n].any()
    names = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in (SAMPLE / "mllm_demo_data").iterdir()}
    seen = [names[hashlib.sha256(media.data(i)).hexdigest()] for i in range(len(media))]
    assert seen[:3] == ["1.jpg", "1.jpg", "2.jpg"]


def test_workers_give_the_same_bytes(world: dict[str, Path], single: Path, tmp_path: Path) -> None:
    code, _, err = cli(*args(world, tmp_path / "two", "--workers", "2"))
    assert code == 0, err
    assert store_bytes(tmp_path / "two") == store_bytes(single)


def test_shards_merged_give_the_same_bytes(world: dict[str, Path], single: Path, tmp_path: Path) -> None:
    shards = []
    for i in range(3):
        out = tmp_path / f"shard{i}"
        code, _, err = cli(*args(world, out, "--workers", "1", "--num-shards", "3", "--shard-index", str(i)))
        assert code == 0, err
        shards.append(str(out))
    code, _, err = cli("merge", *shards, "--output", str(tmp_path / "merged"), "-q")
    assert code == 0, err
    assert store_bytes(tmp_path / "merged") == store_bytes(single)


def dying_executor(after: int) -> object:
    """A local executor 'killed' (KeyboardInterrupt) after `after` chunks were journaled."""

    def execute(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        for done, result in enumerate(local_executor(1)(tasks)):
            if done == after:
                raise KeyboardInterrupt
            yield result

    return execute


def test_a_killed_run_resumes_to_the_same_bytes(world: dict[str, Path], single: Path, tmp_path: Path) -> None:
    config = TokenizeConfig((str(world["src"]),), str(world["model"]), str(tmp_path / "r"), format="auto",
                            workers=1, backend="hf", chunk_bytes=CHUNK)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(config, executor=dying_executor(2))  # type: ignore[arg-type]
    assert not (tmp_path / "r").exists()
    result = tokenize_corpus(config)
    assert result.reused_chunks == 2 and result.n_chunks > 2
    assert store_bytes(tmp_path / "r") == store_bytes(single)


@pytest.mark.parametrize(
    ("images", "words"),
    [
        (["mllm_demo_data/nope.jpg"], "images[0] 'mllm_demo_data/nope.jpg' is missing"),
        (["../../outside.jpg"], "leads outside its folder"),
        (["http://example.com/1.jpg"], "remote http:// URL, packtool works offline"),
        (["mllm_demo_data/1.jpg", "mllm_demo_data/2.jpg"], "miscounted images"),
        (["corrupt.jpg"], "corrupt.jpg"),
    ],
)
def test_bad_images_fail_the_run_in_one_line(world: dict[str, Path], tmp_path: Path, images: list[str],
                                            words: str) -> None:
    folder = tmp_path / "data"
    shutil.copytree(SAMPLE, folder)
    (folder / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    (tmp_path / "outside.jpg").write_bytes((SAMPLE / "mllm_demo_data" / "1.jpg").read_bytes())
    record = json.loads((SAMPLE / "mllm_demo.json").read_text())[1] | {"images": images}
    src = folder / "bad.jsonl"
    src.write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    line = cli_error("tokenize", str(src), "--tokenizer", str(world["model"]), "--output", str(out),
                     "--format", "chat", "-q")
    assert words in line and f"{src}:1" in line, line
    assert not out.exists()


def test_the_summary_line_counts_the_images(world: dict[str, Path], tmp_path: Path) -> None:
    code, out, err = cli(*[a for a in args(world, tmp_path / "s", "--workers", "1") if a != "-q"])
    assert code == 0, err
    assert "tokenized 20 documents with 24 images (3 unique, " in out and "qwen2_vl)" in out, out


def test_the_demo_in_four_shapes_gives_the_same_store(world: dict[str, Path], tmp_path: Path) -> None:
    stores = []
    for name in ("mllm_demo.json", "mllm_demo_transformers.jsonl", "mllm_demo_openai.jsonl", "mllm_demo.parquet"):
        out = tmp_path / name.replace(".", "_")
        code, _, err = cli("tokenize", str(SAMPLE / name), "--tokenizer", str(world["model"]), "--output", str(out),
                           "--format", "auto", "--workers", "1", "-q")
        assert code == 0, err
        stores.append({k: v for k, v in store_bytes(out).items() if k != "manifest.json"})  # it names its input
    assert all(s == stores[0] for s in stores[1:])
    assert set(stores[0]) >= {"tokens.bin", "tokens.boundaries", "tokens.loss"} and len(stores[0]) > 3
