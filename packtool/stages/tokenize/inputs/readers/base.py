"""The contract of an input reader: one source kind, its constants, `plan` and `read`.

A reader turns the bytes of one kind of file into records. It says what it is (`kind`, the chunk
kind that resume keys name; `suffixes`; how its records are numbered; its hub file family) and
does two things: `plan(path, chunk_bytes)` cuts a file into spans of about `chunk_bytes` (byte
ranges, row ranges, or the whole file), depending on the file alone, never on the number of
workers; `read(chunk, limit, separator)` yields the records of one planned chunk in order, an
over-long record (`limit` bytes) as an error record, never read whole. Which records a file holds
and how a record becomes text are not a reader's business: locators find files, shapes read
records.

Readers are light to import (their heavy modules are imported inside `plan` and `read`): the
registry imports them all to derive the CLI help.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.record import RawRecord

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk


class Numbering(Enum):
    """How a reader numbers its records, which is what `file:N` in an error and `line` in rejects.jsonl mean."""

    LINE = "line"  # the 1-based physical line where the record starts
    ROW = "row"  # the 1-based row
    INDEX = "index"  # the 0-based position of the element


class Span(NamedTuple):
    """A planned piece of one file: the `Chunk` fields a reader decides (the whole file by default)."""

    start: int = 0
    end: int = -1
    first: int = 1
    n_bytes: int = 0


class Plan(NamedTuple):
    """A file's plan: its size, its spans, and the kind that reads them when not the planning reader's own
    (a `.json` file holding JSON Lines is read by the jsonl reader)."""

    n_bytes: int
    spans: list[Span]
    read_as: str | None = None


class Reader(Protocol):
    """One source kind (see the module docstring): its constants (class attributes of a reader; read-only
    properties here) and its two methods."""

    @property
    def kind(self) -> str:
        """The chunk kind, unique: resume keys and `Chunk.kind` name it."""

    @property
    def suffixes(self) -> tuple[str, ...]:
        """Lower-case file name endings, e.g. (".jsonl.gz",)."""

    @property
    def numbering(self) -> Numbering: ...

    @property
    def family(self) -> str:
        """The hub file family: a snapshot without a PATH reads its most common family."""

    @property
    def family_rank(self) -> int:
        """Which family a tie between family counts prefers (lowest first); the same for a whole family."""

    @property
    def joins_files(self) -> bool:
        """Whole small files of this kind run together into one chunk (.txt)."""

    @property
    def record_label(self) -> str:
        """What an INDEX-numbered record is "record N ..." of, in errors ("" otherwise)."""

    @property
    def not_data(self) -> frozenset[str]:
        """File names of this kind that a directory walk leaves out (metadata, not records)."""

    def plan(self, path: str, chunk_bytes: int) -> Plan: ...

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]: ...


class ReaderDefaults:
    """The constants most readers share; a reader class sets its own and inherits the rest."""

    joins_files: bool = False
    record_label: str = ""
    not_data: frozenset[str] = frozenset()


def whole_file(path: str) -> Plan:
    """The plan of a file read whole: its size, one span. An unreadable file fails here, before any work
    (its sha256 comes later, beside the work)."""
    with reading(path), open(path, "rb") as fh:
        fh.read(1)
        size = os.fstat(fh.fileno()).st_size
    return Plan(size, [Span(n_bytes=size)])
