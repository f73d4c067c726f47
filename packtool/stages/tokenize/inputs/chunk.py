"""`Chunk`: one deterministic unit of work, what planning makes and a reader reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    """One deterministic unit of work. `start`/`end`: bytes (jsonl, json), row groups (parquet) or rows
    (arrow); `first_line`: the first record's number (a line, or a 0-based index). Its fields are part of
    the resume key: they must not change for the same file and `chunk_bytes`."""

    index: int
    kind: str
    paths: tuple[str, ...]
    start: int = 0
    end: int = -1
    first_line: int = 1
    n_bytes: int = 0
