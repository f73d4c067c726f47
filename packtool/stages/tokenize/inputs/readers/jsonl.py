"""JSON Lines: `.jsonl`, and `.jsonl.gz` / `.jsonl.zst` (one JSON value per line).

A plain file is cut into byte ranges aligned to line starts, each with the 1-based number of its
first line; a compressed file is one chunk (a stream cannot seek). Blank (whitespace-only) lines
are not records: they are skipped silently, as most jsonl writers and readers do; every other line
is a record, good or bad (malformed JSON, invalid UTF-8, over `--max-record-bytes`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span, whole_file
from packtool.stages.tokenize.inputs.record import BOM, RawRecord, too_long_reason

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk
    from packtool.stages.tokenize.inputs.streams import TooLong

_BLOCK = 1 << 22


class JsonlReader(ReaderDefaults):
    kind: str = "jsonl"
    suffixes: tuple[str, ...] = (".jsonl",)
    compression: str = ""  # "", "gz" or "zst"
    numbering: Numbering = Numbering.LINE
    family: str = "json"
    family_rank: int = 2

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        return plan_lines(path, chunk_bytes) if not self.compression else whole_file(path)

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        from packtool.stages.tokenize.inputs.streams import blocks, split_records

        path = chunk.paths[0]
        pieces = split_records(blocks(path, self.compression, chunk.start, chunk.end), b"\n", limit)
        yield from json_lines(path, pieces, chunk.first_line, limit)


class GzipJsonlReader(JsonlReader):
    kind = "jsonl.gz"
    suffixes = (".jsonl.gz",)
    compression = "gz"


class ZstdJsonlReader(JsonlReader):
    kind = "jsonl.zst"
    suffixes = (".jsonl.zst",)
    compression = "zst"


READERS = (JsonlReader(), GzipJsonlReader(), ZstdJsonlReader())


def plan_lines(path: str, chunk_bytes: int) -> Plan:
    """Chunk starts: the first line start at or after each k*chunk_bytes, with its 1-based line number."""
    starts: list[tuple[int, int]] = [(0, 1)]  # (byte offset, 1-based line number)
    target = chunk_bytes
    offset = 0
    lines_before = 0
    with reading(path), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            end = offset + len(block)
            while target <= end and target > 0:
                nl = block.find(b"\n", max(target - 1 - offset, 0))
                if nl < 0:
                    break  # the line continues into the next block
                cut = offset + nl + 1
                if cut > starts[-1][0]:
                    starts.append((cut, lines_before + block.count(b"\n", 0, nl + 1) + 1))
                target = max(target + chunk_bytes, cut + 1)
            lines_before += block.count(b"\n")
            offset = end
    if len(starts) > 1 and starts[-1][0] >= offset:
        starts.pop()  # the last cut sits at end of file
    ends = [s for s, _ in starts[1:]] + [offset]
    return Plan(offset, [Span(s, e, line, e - s) for (s, line), e in zip(starts, ends, strict=True)])


def json_lines(path: str, pieces: Iterator[bytes | TooLong], first_line: int, limit: int) -> Iterator[RawRecord]:
    """One record per line piece, numbered from `first_line`; blank lines are not records."""
    import orjson

    from packtool.stages.tokenize.inputs.streams import TooLong

    loads, error = orjson.loads, orjson.JSONDecodeError
    for line, piece in enumerate(pieces, first_line):
        if isinstance(piece, TooLong):
            yield RawRecord(path, line, error=too_long_reason(piece.n_bytes, limit))
            continue
        if line == 1 and piece.startswith(BOM):  # a UTF-8 byte order mark starts the file, not the record
            piece = piece[len(BOM) :]
        try:
            yield RawRecord(path, line, loads(piece))
        except error as exc:
            if not piece.strip():
                continue  # a blank line is not a record
            yield RawRecord(path, line, error=_reason(piece, str(exc)))


#: a UTF-8 byte order mark inside a file, where only its first line may carry one (files joined with `cat`)
BOM_INSIDE = (
    "a UTF-8 byte order mark (BOM) starts this line, but only a file's first line may carry one "
    "(files joined with `cat`?): remove it"
)


def _reason(piece: bytes, message: str) -> str:
    """Why a line is not a record: a BOM past the first line (orjson says "UTF-8 BOM is not supported", which
    read as "invalid UTF-8"), invalid UTF-8, or malformed JSON with the parser's words."""
    if piece.startswith(BOM):
        return BOM_INSIDE
    return "invalid UTF-8" if "utf-8" in message.lower() else f"malformed JSON ({message})"
