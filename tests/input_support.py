"""Helpers of the input room's tests (`test_input_*.py`): run the CLI, compare stores, lay out a hub cache,
interrupt and resume a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import cli, crashing_executor

import packtool
from packtool.exec.local import thread_executor

STORE_FILES = ("tokens.bin", "tokens.boundaries", "tokens.loss")


def tokenize_ok(inputs: list[Path] | list[str], tok: Path, out: Path, *flags: str) -> Path:
    """`packtool tokenize` through the CLI, which must succeed; the store."""
    code, _, err = cli("tokenize", *map(str, inputs), "--tokenizer", str(tok), "--output", str(out), "-q", *flags)
    assert code == 0, err
    return out


def same_store_bytes(a: Path, b: Path) -> None:
    """Two token stores hold the same ids, boundaries and loss mask, byte for byte."""
    for name in STORE_FILES:
        assert (a / name).is_file() == (b / name).is_file(), name
        if (a / name).is_file():
            assert (a / name).read_bytes() == (b / name).read_bytes(), (b, name)


def hub_repo(cache: Path, kind: str, name: str, files: dict[str, bytes], rev: str = "0f1e2d3c") -> Path:
    """A hub cache repo laid out as huggingface_hub writes it (snapshot files are links into blobs/); the repo."""
    repo = cache / f"{kind}--{name.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "snapshots" / rev).mkdir(parents=True)
    for i, (rel, data) in enumerate(sorted(files.items())):
        blob = repo / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / rev / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    return repo


def check_resume(path: Path, tok: Path, tmp_path: Path, chunk_bytes: int) -> dict[str, object]:
    """A run of `path` killed after 4 chunks resumes them and ends with the uninterrupted run's bytes; its manifest."""

    def config(out: str) -> packtool.TokenizeConfig:
        return packtool.TokenizeConfig(inputs=(str(path),), tokenizer=str(tok), output=str(tmp_path / out),
                                       chunk_bytes=chunk_bytes, workers=1)

    reference = packtool.tokenize_corpus(config("ref"))
    assert reference.n_chunks > 6
    with pytest.raises(KeyboardInterrupt):
        packtool.tokenize_corpus(config("resumed"), executor=crashing_executor(4))
    resumed = packtool.tokenize_corpus(config("resumed"), executor=thread_executor(2))
    assert resumed.reused_chunks == 4
    same_store_bytes(tmp_path / "ref", tmp_path / "resumed")
    assert resumed.manifest["sources"] == reference.manifest["sources"]
    return reference.manifest
