"""Input files -> deterministic chunks, and a chunk -> its records, through the readers' registry.

A chunk is the unit of work a tokenizer worker (a local thread or process, or a Ray task) handles
on its own; each reader decides how its files are cut (`Reader.plan`): byte ranges aligned to
line starts (jsonl) or to array elements (`.json`), runs of parquet row groups, row ranges of an
Arrow file, a whole compressed file; files of a kind that `joins_files` (`.txt`) run together into
one chunk of about `chunk_bytes`. Chunking depends only on the files and `chunk_bytes`, never on
the number of workers, so every worker count writes the same bytes and an interrupted run
resumes chunk by chunk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.readers.registry import reader_for, reader_named
from packtool.stages.tokenize.inputs.record import DEFAULT_MAX_RECORD_BYTES, RawRecord

_BLOCK = 1 << 22


@dataclass(frozen=True)
class SourceFile:
    """A planned input file. Its sha256 (manifest, resume) is computed beside the work, not before it."""

    path: str
    n_bytes: int


def input_bytes(paths: Sequence[Path]) -> int:
    """The inputs' total size on disk (an input that cannot be read counts 0: `plan_chunks` reports it)."""
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
    return total


def plan_chunks(paths: Sequence[Path], chunk_bytes: int) -> tuple[list[SourceFile], list[Chunk]]:
    """Cut the inputs into chunks of about `chunk_bytes` (see the module docstring); a broken file fails here,
    before any work."""
    sources: list[SourceFile] = []
    chunks: list[Chunk] = []
    run: list[SourceFile] = []  # whole files of a joining kind, waiting to become one chunk
    run_kind = ""

    def flush() -> None:
        if run:
            chunks.append(Chunk(len(chunks), run_kind, tuple(s.path for s in run), n_bytes=sum(s.n_bytes for s in run)))
            run.clear()

    for path in paths:
        reader = reader_for(path)
        if reader is None:
            raise InputError(
                "no reader for this file name", str(path), hint="this is a bug: locators yield only readable files"
            )
        plan = reader.plan(str(path), chunk_bytes)
        source = SourceFile(str(path), plan.n_bytes)
        sources.append(source)
        kind = plan.read_as or reader.kind
        if reader_named(kind).joins_files:
            if run and (run_kind != kind or sum(s.n_bytes for s in run) + source.n_bytes > chunk_bytes):
                flush()
            run.append(source)
            run_kind = kind
            continue
        flush()
        base = len(chunks)
        chunks.extend(
            Chunk(base + i, kind, (source.path,), s.start, s.end, s.first, s.n_bytes) for i, s in enumerate(plan.spans)
        )
    flush()
    return sources, chunks


def read_chunk(
    chunk: Chunk, *, separator: str | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[RawRecord]:
    """Yield the records of a chunk in order: parsed values, rows or texts, or errors.

    A record over `max_record_bytes` is an error record (never read whole into memory); an
    unreadable, truncated or corrupted file raises InputError (a file-level error, even with
    `--on-error skip`).
    """
    return reader_named(chunk.kind).read(chunk, max(1, int(max_record_bytes)), separator)


class SourceHashes:
    """sha256 of every input, one file after another in a background thread beside the work (hashlib and
    reads release the GIL).

    Each file's digest is known as soon as that file is read, not when the last one is: a resume trusts a
    chunk only once its files' digests are journaled, so a run killed while a 1 TB input list is still being
    hashed keeps the chunks of the files already hashed. The digests are otherwise needed only at the end
    (manifest) or to check an existing store."""

    def __init__(self, sources: Sequence[SourceFile]) -> None:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-hash")
        self._futures: dict[str, Future[str]] = {}
        for source in sources:
            if source.path not in self._futures:
                self._futures[source.path] = pool.submit(_sha256, source.path)
        pool.shutdown(wait=False)
        self._order = list(self._futures)
        self._reported = 0

    def get(self, path: str) -> str:
        """One file's digest (waits for it); raises InputError if it could not be read."""
        return self._futures[path].result()

    def result(self) -> dict[str, str]:
        """Every file's digest (waits for all)."""
        return {path: future.result() for path, future in self._futures.items()}

    def newly_done(self) -> list[tuple[str, str]]:
        """The digests finished since the last call, in file order (files are hashed in that order)."""
        done: list[tuple[str, str]] = []
        while self._reported < len(self._order) and self._futures[self._order[self._reported]].done():
            path = self._order[self._reported]
            done.append((path, self._futures[path].result()))
            self._reported += 1
        return done


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with reading(path), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()
