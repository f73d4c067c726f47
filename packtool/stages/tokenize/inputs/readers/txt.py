"""Plain text: `.txt`, one document per file, or one per piece between `--separator` strings.

Files are read whole, so consecutive `.txt` files run together into one chunk of about
`chunk_bytes` (`joins_files`): a corpus of many small documents is not one task per file. A file
or piece is numbered by the 1-based line it starts on; one that is not UTF-8 is a bad record at the
line of its first bad byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, whole_file
from packtool.stages.tokenize.inputs.record import BOM, PlainText, RawRecord, not_utf8_reason, too_long_reason

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk


class TxtReader(ReaderDefaults):
    kind: str = "txt"
    suffixes: tuple[str, ...] = (".txt",)
    numbering: Numbering = Numbering.LINE
    family: str = "txt"
    family_rank: int = 3
    joins_files: bool = True

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        return whole_file(path)

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        for path in chunk.paths:
            yield from _records(path, separator, limit)


READERS = (TxtReader(),)


def _records(path: str, separator: str | None, limit: int) -> Iterator[RawRecord]:
    from packtool.stages.tokenize.inputs.streams import TooLong, file_blocks, split_records

    if not separator:
        size = os.path.getsize(path)
        if size > limit:
            yield RawRecord(path, 1, error=too_long_reason(size, limit))
            return
        with reading(path):
            yield _record(path, 1, Path(path).read_bytes(), strip_bom=True)
        return
    sep = separator.encode("utf-8")
    line = 1
    for i, piece in enumerate(split_records(file_blocks(path), sep, limit)):
        if isinstance(piece, TooLong):
            yield RawRecord(path, line, error=too_long_reason(piece.n_bytes, limit))
            line += piece.newlines + sep.count(b"\n")
            continue
        yield _record(path, line, piece, strip_bom=i == 0)
        line += piece.count(b"\n") + sep.count(b"\n")


def _record(path: str, line: int, data: bytes, strip_bom: bool) -> RawRecord:
    if strip_bom and data.startswith(BOM):
        data = data[len(BOM) :]
    try:
        return RawRecord(path, line, PlainText(data.decode("utf-8")))
    except UnicodeDecodeError as exc:
        return RawRecord(
            path, line + data.count(b"\n", 0, exc.start), error=not_utf8_reason(data, exc.start, "document")
        )
