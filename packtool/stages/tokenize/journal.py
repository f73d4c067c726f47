"""The resumable work directory `.{DIR}.partial/` next to the output: the growing store + a journal.

Layout: `store/` is the token store being written (its files grow in chunk order; the formats
module owns every byte of it), `settings.sha256` the fingerprint of the settings it was made
with, and `journal.jsonl` one line per chunk appended to the store (its resume key, counts, and
the store's `StoreMark` after it: sizes and sha256 of every file so far) plus one line per input
file once its sha256 is known. Lines are appended by the one coordinating thread, after the
chunk's bytes were written. A re-run with the same settings keeps the longest prefix of chunks
whose key matches, whose inputs still hash alike, and whose bytes still hash to their marks
(`resume_token_store` checks that); everything after it is redone. Nothing here is fsynced
per chunk: a line that outlives its data (power loss) fails that check and its chunk is redone.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.formats import jsontext
from packtool.formats.atomic import write_bytes_atomic
from packtool.formats.faults import fault_point

JOURNAL = "journal.jsonl"
STORE = "store"
SETTINGS = "settings.sha256"


def work_dir_for(output: Path) -> Path:
    """The hidden sibling that holds resumable work for `output`."""
    return output.with_name(f".{output.name}.partial")


@dataclass
class ChunkResult:
    """What one chunk produced. `parts` (ids, lengths, loss per batch) and `rejects` travel in memory
    from the task to the coordinator; the rest (and the store's mark after it) is the journal line."""

    index: int
    key: str
    n_documents: int = 0
    n_tokens: int = 0
    n_bytes: int = 0
    sources: dict[str, list[int]] = field(default_factory=dict)  # path -> [records, documents, rejected]
    reasons: dict[str, int] = field(default_factory=dict)  # reject reason kind -> count (`chunks.reason_kind`)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = field(default_factory=list, repr=False)
    rejects: bytes = field(default=b"", repr=False)
    #: image occurrences (`vision.ImageRow`: document index within the chunk, offset, n_tokens, grid, n_patches,
    #: encoded bytes), in document then offset order; written by the coordinator with the store's MediaWriter
    media: list[tuple[int, int, int, tuple[int, int, int], int, bytes]] = field(default_factory=list, repr=False)
    mark: dict[str, Any] | None = None

    def to_json(self) -> str:
        keys = ("index", "key", "n_documents", "n_tokens", "n_bytes", "sources", "reasons", "mark")
        return json.dumps({k: getattr(self, k) for k in keys}, sort_keys=True)

    def release(self) -> None:
        """Drop the arrays once they are in the store (the journal keeps the counts)."""
        self.parts = []
        self.rejects = b""
        self.media = []


class Journal:
    """The coordinator's view of the work directory: what was done before, and recording what gets done."""

    def __init__(self, work_dir: Path, fingerprint: str) -> None:
        self.work_dir = work_dir
        self.store_dir = work_dir / STORE
        marker = work_dir / SETTINGS
        if work_dir.exists() and (not marker.is_file() or marker.read_text().strip() != fingerprint):
            shutil.rmtree(work_dir)  # made with other settings: nothing in it can be reused
        work_dir.mkdir(parents=True, exist_ok=True)
        if not marker.is_file():
            marker.write_text(fingerprint + "\n")
        self.done: dict[int, ChunkResult] = {}
        self.source_hashes: dict[str, str] = {}
        path = work_dir / JOURNAL
        if path.is_file():
            for line in path.read_text("utf-8").splitlines():
                try:
                    data = jsontext.loads(line)
                    if "source" in data:
                        self.source_hashes[str(data["source"])] = str(data["sha256"])
                    else:
                        result = ChunkResult(**data)
                        self.done[result.index] = result
                except (ValueError, TypeError):
                    continue  # a line cut short by a kill
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def restart(self, kept: list[ChunkResult], sources: dict[str, str]) -> None:
        """Rewrite the journal to hold only what this run keeps (in one atomic step)."""
        self._fh.close()
        lines = [json.dumps({"source": p, "sha256": h}) for p, h in sources.items()] + [r.to_json() for r in kept]
        write_bytes_atomic(self.work_dir / JOURNAL, "".join(line + "\n" for line in lines).encode())
        self.done = {r.index: r for r in kept}
        self.source_hashes = dict(sources)
        self._fh = open(self.work_dir / JOURNAL, "a", encoding="utf-8")  # noqa: SIM115

    def record(self, result: ChunkResult) -> None:
        fault_point("tokenize.journal:record")
        self._fh.write(result.to_json() + "\n")
        self._fh.flush()
        fault_point("tokenize.journal:recorded")
        self.done[result.index] = result

    def record_source(self, path: str, sha256: str) -> None:
        self._fh.write(json.dumps({"source": path, "sha256": sha256}) + "\n")
        self._fh.flush()
        self.source_hashes[path] = sha256

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)
