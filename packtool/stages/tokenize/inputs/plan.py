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


def hash_sources(sources: Sequence[SourceFile]) -> Future[dict[str, str]]:
    """sha256 of every input, in a background thread beside the work (hashlib and reads release the GIL).

    The digests are needed only at the end (manifest) or to check an existing store or a resume."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-hash")
    future = pool.submit(lambda: {s.path: _sha256(s.path) for s in sources})
    pool.shutdown(wait=False)
    return future


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with reading(path), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()
