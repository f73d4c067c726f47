"""The resumable work directory `.{DIR}.partial/` next to the output: chunk files + a journal.

Layout: `chunks/NNNNN.bin` (token ids, store dtype), `.lengths` (int64 per document), `.loss`
(uint8 per token, formats with non-target tokens), `.rejects` (jsonl lines) and
`journal.jsonl`, one line per finished chunk with its resume key and the sha256 of each of
its files. Chunk files are written under temporary names and renamed when complete; the
journal line is appended (and fsynced) only after that, by the one coordinating process.
A chunk is reused on a re-run when its key (settings fingerprint + source sha256 + range)
matches and its files still hash to the journaled values; anything else is redone.
These files are private to tokenization; the token store itself is written only by
`packtool.formats.token_store`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from packtool.formats.faults import fault_point
from packtool.formats.files import sha256_file

JOURNAL = "journal.jsonl"
CHUNKS = "chunks"


def work_dir_for(output: Path) -> Path:
    """The hidden sibling that holds resumable work for `output`."""
    return output.with_name(f".{output.name}.partial")


def chunk_path(work_dir: str | Path, index: int, suffix: str) -> Path:
    return Path(work_dir) / CHUNKS / f"{index:05d}.{suffix}"


@dataclass
class ChunkResult:
    """What one chunk produced; small, picklable, and the payload of its journal line."""

    index: int
    key: str
    n_documents: int = 0
    n_tokens: int = 0
    n_bytes: int = 0
    sources: dict[str, list[int]] = field(default_factory=dict)  # path -> [records, documents, rejected]
    files: dict[str, str] = field(default_factory=dict)  # suffix -> sha256

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class ChunkWriter:
    """Streams one chunk's outputs to temporary files; `commit` renames them and records hashes."""

    def __init__(self, work_dir: str, index: int, with_loss: bool) -> None:
        self.work_dir, self.index = work_dir, index
        names = ["bin", "lengths", "rejects"] + (["loss"] if with_loss else [])
        self._files: dict[str, BinaryIO] = {}
        self._hashes = {name: hashlib.sha256() for name in names}
        for name in names:
            path = chunk_path(work_dir, index, name)
            self._files[name] = open(path.with_name(path.name + f".tmp-{os.getpid()}"), "wb")  # noqa: SIM115

    def _write(self, name: str, data: bytes) -> None:
        self._files[name].write(data)
        self._hashes[name].update(data)

    def append(self, ids: np.ndarray, lengths: np.ndarray, loss: np.ndarray | None) -> None:
        self._write("bin", ids.tobytes())
        self._write("lengths", lengths.astype("<i8", copy=False).tobytes())
        if "loss" in self._files:
            self._write(
                "loss", (np.ones(ids.size, np.uint8) if loss is None else loss.astype(np.uint8, copy=False)).tobytes()
            )

    def reject(self, source: str, line: int | None, reason: str) -> None:
        self._write(
            "rejects",
            (json.dumps({"source": source, "line": line, "reason": reason}, ensure_ascii=False) + "\n").encode(),
        )

    def commit(self) -> dict[str, str]:
        """Make the chunk's files visible under their final names; return suffix -> sha256."""
        fault_point("tokenize.chunk:commit")
        for name, fh in self._files.items():
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            os.replace(fh.name, chunk_path(self.work_dir, self.index, name))
        return {name: h.hexdigest() for name, h in self._hashes.items()}

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abort()

    def abort(self) -> None:
        """Close and remove the temporary files (a chunk that failed leaves nothing)."""
        for fh in self._files.values():
            fh.close()
            Path(fh.name).unlink(missing_ok=True)


class Journal:
    """The coordinator's view of the work directory: what is done, and appending what gets done."""

    def __init__(self, work_dir: Path, fingerprint: str) -> None:
        self.work_dir = work_dir
        marker = work_dir / "settings.sha256"
        if work_dir.exists() and (not marker.is_file() or marker.read_text().strip() != fingerprint):
            shutil.rmtree(work_dir)  # made with other settings: nothing in it can be reused
        (work_dir / CHUNKS).mkdir(parents=True, exist_ok=True)
        if not marker.is_file():
            marker.write_text(fingerprint + "\n")
        self._done: dict[int, ChunkResult] = {}
        path = work_dir / JOURNAL
        if path.is_file():
            for line in path.read_text("utf-8").splitlines():
                try:
                    result = ChunkResult(**json.loads(line))
                except (ValueError, TypeError):
                    continue  # a line cut short by a kill
                self._done[result.index] = result
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def reusable(self, index: int, key: str) -> ChunkResult | None:
        """The journaled result of chunk `index` if its key matches and its files are intact."""
        result = self._done.get(index)
        if result is None or result.key != key:
            return None
        for suffix, digest in result.files.items():
            path = chunk_path(self.work_dir, index, suffix)
            if not path.is_file() or sha256_file(path) != digest:
                return None
        return result

    def record(self, result: ChunkResult) -> None:
        fault_point("tokenize.journal:record")
        self._fh.write(result.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        fault_point("tokenize.journal:recorded")
        self._done[result.index] = result

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)


def read_chunk_arrays(
    work_dir: Path, index: int, dtype: np.dtype, with_loss: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Load a finished chunk's ids, lengths and loss for the final concatenation."""
    ids = np.fromfile(chunk_path(work_dir, index, "bin"), dtype=dtype)
    lengths = np.fromfile(chunk_path(work_dir, index, "lengths"), dtype="<i8")
    loss = np.fromfile(chunk_path(work_dir, index, "loss"), dtype=np.uint8) if with_loss else None
    return ids, lengths, loss


def rejects_bytes(work_dir: Path, index: int) -> bytes:
    path = chunk_path(work_dir, index, "rejects")
    return path.read_bytes() if path.is_file() else b""
