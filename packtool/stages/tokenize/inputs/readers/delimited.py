"""CSV and TSV: `.csv`, `.tsv`, and their `.gz` / `.zst`. The header row names the fields.

A record is one row after the header (the first non-blank row), a dict of the header's names to its
cells, read with Python's `csv` module (`,` or a tab between cells, `"` quoting, `""` a quote inside
one, cells over several lines inside quotes); blank rows are not records. Every cell is the string
written; one whose first non-space character is `[` or `{` is a `JsonText`, which a shape reads as the
JSON value it holds where it wants a list or an object (a `messages` column, `tools`, a dotted path)
and as its text where it wants text, so the field flags work as for jsonl and an Alpaca `input` of
`[4, 21, 11]` stays text. A record is numbered by the physical line it starts on.

A plain file is cut into byte ranges at row ends, found by a compiled scanner (numba) that follows
the quoting as `csv` does (a `"` opens a quoted cell only at a cell's start), so a cut never falls
inside a quoted cell and every chunk starts a row: chunks are read in parallel and resume as jsonl
chunks do (each chunk reads the header from the file's start). A compressed file is one chunk. A row
over `--max-record-bytes` is an error record, skipped unread; so is a row that is not UTF-8, whose
cells are more or fewer than the header's names, or that `csv` refuses. A quoted cell that the file
ends inside is a file-level error naming the line it starts on; so is a header naming a field twice.
An empty file holds no records, as an empty jsonl does.

Here: the six kinds, their plan and the rows -> records of a chunk (header, `csv` parsing, cells -> fields).
The row scanner is `inputs/csvscan.py`; what a file that is not CSV text is, `inputs/csvsniff.py`.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from packtool.core.encoding.shapes.fields import JsonText
from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.csvscan import HINT, QUOTED, STATE, breaks, new_state, row_batches, row_ends
from packtool.stages.tokenize.inputs.csvsniff import ENCODING_HINT, check_encoding
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span, whole_file
from packtool.stages.tokenize.inputs.record import BOM, RawRecord, not_utf8_reason, too_long_reason

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk
    from packtool.stages.tokenize.inputs.streams import TooLong

_BLOCK = 1 << 22
_HEADER_BLOCK = 1 << 16
_UNCLOSED = "a quoted cell is not closed: the file ends inside the row that starts here"
#: `csv`'s cap on a cell (128 KiB by default) is raised once to this: a row is already capped by --max-record-bytes
_FIELD_LIMIT = (1 << 31) - 1
_JSON_START = re.compile(r"\s*[\[{]")
_NOT_UTF8 = "invalid UTF-8"


class CsvReader(ReaderDefaults):
    kind: str = "csv"
    suffixes: tuple[str, ...] = (".csv",)
    delimiter: str = ","
    compression: str = ""  # "", "gz" or "zst"
    numbering: Numbering = Numbering.LINE
    family: str = "csv"
    family_rank: int = 4

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        return _plan(path, chunk_bytes, self.delimiter) if not self.compression else whole_file(path)

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        from packtool.stages.tokenize.inputs.streams import blocks

        path = chunk.paths[0]
        header = None if chunk.start == 0 else _header(path, self.delimiter, limit)
        rows = row_batches(
            path, blocks(path, self.compression, chunk.start, chunk.end), self.delimiter, limit, self.compression
        )
        yield from _records(path, rows, self.delimiter, header, chunk.first_line, limit)


class _Gz(CsvReader):
    kind, suffixes, compression = "csv.gz", (".csv.gz",), "gz"


class _Zst(CsvReader):
    kind, suffixes, compression = "csv.zst", (".csv.zst",), "zst"


class _Tsv(CsvReader):
    kind, suffixes, delimiter = "tsv", (".tsv",), "\t"


class _TsvGz(_Tsv):
    kind, suffixes, compression = "tsv.gz", (".tsv.gz",), "gz"


class _TsvZst(_Tsv):
    kind, suffixes, compression = "tsv.zst", (".tsv.zst",), "zst"


READERS = (CsvReader(), _Gz(), _Zst(), _Tsv(), _TsvGz(), _TsvZst())


def _plan(path: str, chunk_bytes: int, delimiter: str) -> Plan:
    """Chunk starts: the first row end at or after each k*chunk_bytes, with the line number after it; the
    whole file is scanned, so a quoted cell left open at its end is found here, before any work."""
    import numpy as np

    starts: list[tuple[int, int]] = [(0, 1)]  # (byte offset, 1-based line number)
    target = chunk_bytes
    offset = lines = 0
    row_line = 1  # where the row being read began (a quoted cell left open names it)
    state = new_state()
    with reading(path), open(path, "rb") as fh:
        for block, ends in row_ends(iter(lambda: fh.read(_BLOCK), b""), delimiter, state):
            k = int(np.searchsorted(ends, target - 1 - offset)) if ends.size else 0
            while k < ends.size:
                cut = offset + int(ends[k]) + 1
                starts.append((cut, lines + breaks(block, 0, int(ends[k]) + 1) + 1))
                target = max(target + chunk_bytes, cut + chunk_bytes)
                k = int(np.searchsorted(ends, target - 1 - offset))
            if ends.size:
                row_line = lines + breaks(block, 0, int(ends[-1]) + 1) + 1
            lines += breaks(block)
            offset += len(block)
    if int(state[STATE]) == QUOTED:
        check_encoding(path, "")
        raise InputError(_UNCLOSED, path, row_line, hint=HINT)
    if len(starts) > 1 and starts[-1][0] >= offset:
        starts.pop()  # the last cut sits at end of file
    ends_at = [s for s, _ in starts[1:]] + [offset]
    return Plan(offset, [Span(s, e, line, e - s) for (s, line), e in zip(starts, ends_at, strict=True)])


def _header(path: str, delimiter: str, limit: int) -> list[str]:
    """The header of a file whose chunk starts after it: its first non-blank row, read in small blocks."""

    def blocks() -> Iterator[bytes]:
        with reading(path), open(path, "rb") as fh:
            yield from iter(lambda: fh.read(_HEADER_BLOCK), b"")

    rows = row_batches(path, blocks(), delimiter, limit)
    line = 1
    try:
        for batch in rows:
            for row in batch:
                for start, got, _ in next(_parsed(path, iter([[row]]), delimiter, line)):
                    return _header_row(got, path, start)
                line += (breaks(row) if isinstance(row, bytes) else row.newlines) + 1
    finally:
        rows.close()
    raise InputError("the file holds no header row naming the fields", path, hint=HINT)


def _header_row(got: list[str] | str | TooLong, path: str, line: int) -> list[str]:
    """The field names of the header row; a header that cannot name the fields is a file-level error."""
    if isinstance(got, str) and got.startswith(_NOT_UTF8):
        check_encoding(path, "")
        raise InputError(
            f"the header row is not UTF-8 text ({got.split('(', 1)[1].split(';')[0]})", path, line, hint=ENCODING_HINT
        )
    if isinstance(got, str):
        raise InputError(f"the header row cannot name the fields ({got})", path, line, hint=HINT)
    if not isinstance(got, list):
        raise InputError(f"the header row is over --max-record-bytes ({got.n_bytes} bytes)", path, line, hint=HINT)
    if any("\0" in name for name in got):  # `csv` reads NUL bytes: a binary file's first bytes as names
        check_encoding(path, "")
    twice = sorted(name for name, n in Counter(got).items() if n > 1)  # linear: a table may have 100k columns
    if twice:
        raise InputError(
            f"the header names field {twice[0]!r} twice", path, line, hint="give every column its own name"
        )
    return got


Parsed = tuple[int, "list[str] | str | TooLong", bool]  # (line, cells or why not or TooLong, may hold JSON)


def _parsed(path: str, batches: Iterator[list[bytes | TooLong]], delimiter: str, line: int) -> Iterator[list[Parsed]]:
    """For each batch of rows, the non-blank ones: (the line the row starts on, its cells, or why it has none, or
    a TooLong; whether a cell may be JSON).

    One `csv` reader parses a batch (each a whole row: the scanner follows `csv`'s quoting). A lone `\r` outside
    quotes ends a row as `csv` reads a file: such a row is parsed alone, its rows sharing one line number."""
    import csv

    if csv.field_size_limit() < _FIELD_LIMIT:
        csv.field_size_limit(_FIELD_LIMIT)
    for batch in batches:
        texts: list[str] = []
        got: list[tuple[int, list[list[str]] | str | TooLong | None, bool]] = []  # None: the next of `texts`
        for row in batch:
            start = line
            if not isinstance(row, bytes):
                line += row.newlines + 1
                got.append((start, row, False))
                continue
            line += breaks(row) + 1
            if start == 1:
                row = row.removeprefix(BOM)  # a UTF-8 byte order mark starts the file, not the header
            try:
                text = row.decode("utf-8")
            except UnicodeDecodeError as exc:
                got.append((start + breaks(row, 0, exc.start), not_utf8_reason(row, exc.start, "row"), False))
                continue
            maybe_json = "[" in text or "{" in text
            if "\r" in text:
                got.append((start, _read_alone(text, delimiter), maybe_json))
            else:
                texts.append(text)
                got.append((start, None, maybe_json))
        reader = csv.reader(texts, delimiter=delimiter)
        out: list[Parsed] = []
        consumed = 0
        for start, item, maybe_json in got:
            if item is None:
                consumed += 1
                try:
                    cells: list[str] | str = next(reader)
                except csv.Error as exc:
                    cells = f"not a CSV row ({exc})"
                if reader.line_num != consumed:  # csv read past a row's end: the scanner and csv disagree
                    raise InputError(f"rows out of step near line {start}", path, hint="this is a bug")
                if cells:
                    out.append((start, cells, maybe_json))
            elif isinstance(item, list):
                out.extend((start, cells, maybe_json) for cells in item if cells)
            else:
                out.append((start, item, False))
        yield out


def _read_alone(text: str, delimiter: str) -> list[list[str]] | str:
    """The rows of one row's text holding a lone `\r` (it ends a row, as when `csv` reads a file)."""
    import csv

    try:
        return list(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter))
    except csv.Error as exc:
        return f"not a CSV row ({exc})"


def _records(
    path: str, rows: Iterator[list[bytes | TooLong]], delimiter: str, header: list[str] | None, line: int, limit: int
) -> Iterator[RawRecord]:
    """Rows -> records (dicts of the header's names), numbered by the line each row starts on. Without a
    `header`, the chunk starts the file: its first non-blank row is the header."""
    for parsed in _parsed(path, rows, delimiter, line):
        for start, got, maybe_json in parsed:
            if header is None:
                header = _header_row(got, path, start)
            elif isinstance(got, str):
                yield RawRecord(path, start, error=got)
            elif not isinstance(got, list):
                yield RawRecord(path, start, error=too_long_reason(got.n_bytes, limit))
            elif len(got) != len(header):
                yield RawRecord(
                    path, start, error=f"the row has {len(got)} cells, the header names {len(header)} fields"
                )
            else:
                record = dict(zip(header, got, strict=True))
                if maybe_json:  # text where a shape reads text, its JSON value where it reads a list or object
                    for name, cell in record.items():
                        if _JSON_START.match(cell):
                            record[name] = JsonText(cell)
                yield RawRecord(path, start, record)
