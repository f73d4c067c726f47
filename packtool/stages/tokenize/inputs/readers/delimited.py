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
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from functools import cache
from typing import TYPE_CHECKING

from packtool.core.encoding.shapes.fields import JsonText
from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span, whole_file
from packtool.stages.tokenize.inputs.record import BOM, RawRecord, not_utf8_reason, too_long_reason

if TYPE_CHECKING:
    import numpy as np

    from packtool.stages.tokenize.inputs.chunk import Chunk
    from packtool.stages.tokenize.inputs.streams import TooLong

_BLOCK = 1 << 22
_HEADER_BLOCK = 1 << 16
_UNCLOSED = "a quoted cell is not closed: the file ends inside the row that starts here"
_HINT = "check the file's quoting: a quoted cell must end with '\"' (write a quote inside one as '\"\"')"
_STATE = 0  # the scanner's state, carried across blocks: where the current row stands
_QUOTED = 2  # ... inside a quoted cell (0: at a cell's start, 1: in an unquoted cell, 3: after a quote in a quoted one)
#: `csv`'s cap on a cell (128 KiB by default) is raised once to this: a row is already capped by --max-record-bytes
_FIELD_LIMIT = (1 << 31) - 1
_JSON_START = re.compile(r"\s*[\[{]")
_NOT_UTF8 = "invalid UTF-8"
#: the fix for a file in another encoding (latin-1 and cp1252 are the usual ones: Excel's "CSV" on Windows)
_ENCODING_HINT = (
    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8.csv), or export it as 'CSV UTF-8'"
)
_SNIFF_BYTES = 1 << 20
#: files often named .csv that are not text: (first bytes, what it is, the fix)
_MAGIC = (
    (b"PK\x03\x04", "a zip archive (an Excel .xlsx workbook?)", "save it as 'CSV UTF-8' (or unzip it)"),
    (b"\x1f\x8b", "gzip-compressed", "name it .csv.gz (or .tsv.gz) so it is decompressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "name it .csv.zst (or .tsv.zst) so it is decompressed"),
    (b"PAR1", "a parquet file", "name it .parquet"),
    (b"\xd0\xcf\x11\xe0", "an old Excel .xls workbook", "save it as 'CSV UTF-8'"),
)


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
        rows = _rows(
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


def _scan(
    buf: np.ndarray, delimiter: int, state: np.ndarray, ends: np.ndarray, at_end: int
) -> int:  # pragma: no cover - numba
    """Walk `buf` as `csv` parses it; write the positions of the line ends that end a row into `ends`: a `\n`
    (`\r\n`'s `\n`), or a lone `\r` (classic Mac OS line ends, which `csv` reads as row ends too).

    Returns how many were written (`ends` is as long as `buf`: never full). `state[_STATE]` carries where
    a row stands across blocks: at a cell's start, in an unquoted cell, in a quoted one, or just after a
    quote inside a quoted one (the cell ends, or `""` is a quote). A block never ends with a `\r` unless
    `at_end` (`_row_ends` holds it back), so whether a `\n` follows it is always known."""
    s = state[_STATE]
    n = 0
    i = 0
    size = buf.size
    while i < size:
        if s == 2:  # in a quoted cell: the bulk of a long text, straight to the next quote
            while i < size and buf[i] != 34:
                i += 1
            if i < size:
                s = 3
            i += 1
            continue
        if s == 1:  # in an unquoted cell: straight to its end
            while i < size and buf[i] != delimiter and buf[i] != 10 and buf[i] != 13:
                i += 1
            if i == size:
                break
        c = buf[i]
        if c == 10:  # \n outside quotes: the row ends
            ends[n] = i
            n += 1
            s = 0
        elif c == 13:  # a line end outside quotes: \r\n's \n ends the row, a lone \r ends it here
            if i + 1 == size or buf[i + 1] != 10:
                ends[n] = i
                n += 1
            s = 0
        elif c == delimiter:  # a cell ends
            s = 0
        elif s == 0:
            s = 2 if c == 34 else 1
        elif s == 3:
            s = 2 if c == 34 else 1  # `""`: a quote inside the cell; else text after the closing quote
        i += 1
    state[_STATE] = s
    return n


@cache
def _kernel() -> Callable[[np.ndarray, int, np.ndarray, np.ndarray, int], int]:
    """`_scan` compiled on first use: numba's import is paid only by runs that read CSV or TSV."""
    from numba import njit

    return njit(cache=True, nogil=True)(_scan)  # type: ignore[no-any-return]


def _row_ends(blocks: Iterator[bytes], delimiter: str, state: np.ndarray) -> Iterator[tuple[bytes, np.ndarray]]:
    """(block, positions of its row-ending line ends) for each block; `state` carries the scanner across them.

    A block's last `\r` is held back to start the next one (a `\r\n` is never cut), so the blocks yielded
    may differ by that byte from the ones read; they hold the same bytes in the same order."""
    import numpy as np

    scan = _kernel()
    carry = b""
    for block in blocks:
        if carry:
            block = carry + block
        block, carry = (block[:-1], b"\r") if block.endswith(b"\r") else (block, b"")
        if block:
            buf = np.frombuffer(block, np.uint8)
            ends = np.empty(buf.size, np.int64)
            n = scan(buf, ord(delimiter), state, ends, 0)
            yield block, ends[:n]
    if carry:
        ends = np.empty(1, np.int64)
        n = scan(np.frombuffer(carry, np.uint8), ord(delimiter), state, ends, 1)
        yield carry, ends[:n]


def _breaks(data: bytes, start: int = 0, end: int | None = None) -> int:
    """Line breaks in `data[start:end]`: `\n`, `\r\n` and a lone `\r` each count one (as editors number lines)."""
    n = data.count(b"\n", start, end)
    cr = data.count(b"\r", start, end)
    return n + cr - data.count(b"\r\n", start, end) if cr else n


def _new_state() -> np.ndarray:
    import numpy as np

    return np.zeros(1, np.int64)


def _plan(path: str, chunk_bytes: int, delimiter: str) -> Plan:
    """Chunk starts: the first row end at or after each k*chunk_bytes, with the line number after it; the
    whole file is scanned, so a quoted cell left open at its end is found here, before any work."""
    import numpy as np

    starts: list[tuple[int, int]] = [(0, 1)]  # (byte offset, 1-based line number)
    target = chunk_bytes
    offset = lines = 0
    row_line = 1  # where the row being read began (a quoted cell left open names it)
    state = _new_state()
    with reading(path), open(path, "rb") as fh:
        for block, ends in _row_ends(iter(lambda: fh.read(_BLOCK), b""), delimiter, state):
            k = int(np.searchsorted(ends, target - 1 - offset)) if ends.size else 0
            while k < ends.size:
                cut = offset + int(ends[k]) + 1
                starts.append((cut, lines + _breaks(block, 0, int(ends[k]) + 1) + 1))
                target = max(target + chunk_bytes, cut + chunk_bytes)
                k = int(np.searchsorted(ends, target - 1 - offset))
            if ends.size:
                row_line = lines + _breaks(block, 0, int(ends[-1]) + 1) + 1
            lines += _breaks(block)
            offset += len(block)
    if int(state[_STATE]) == _QUOTED:
        _check_encoding(path, "")
        raise InputError(_UNCLOSED, path, row_line, hint=_HINT)
    if len(starts) > 1 and starts[-1][0] >= offset:
        starts.pop()  # the last cut sits at end of file
    ends_at = [s for s, _ in starts[1:]] + [offset]
    return Plan(offset, [Span(s, e, line, e - s) for (s, line), e in zip(starts, ends_at, strict=True)])


def _rows(
    path: str, blocks: Iterator[bytes], delimiter: str, limit: int, compression: str = ""
) -> Generator[list[bytes | TooLong], None, None]:
    """The rows of a block stream, a batch per block, each row without its newline, or a `TooLong` for one over
    `limit` bytes (never held: its bytes are dropped as they come). What follows the last row end is the last
    row."""
    from packtool.stages.tokenize.inputs.streams import TooLong

    parts: list[bytes] = []
    held = 0
    dropping, dropped, dropped_nl = False, 0, 0
    state = _new_state()
    for block, ends in _row_ends(blocks, delimiter, state):
        batch: list[bytes | TooLong] = []
        prev = 0
        for end in ends.tolist():
            piece = block[prev:end]
            if block[end] == 10 and piece.endswith(b"\r"):  # \r\n: the row ends at its \r
                piece = piece[:-1]
            if dropping:
                batch.append(TooLong(dropped + len(piece), dropped_nl + _breaks(piece)))
            elif held + len(piece) > limit:
                batch.append(TooLong(held + len(piece), sum(_breaks(p) for p in parts) + _breaks(piece)))
            else:
                batch.append(b"".join((*parts, piece)) if parts else piece)
            parts, held, dropping, prev = [], 0, False, end + 1
        tail = block[prev:]
        if dropping:
            dropped, dropped_nl = dropped + len(tail), dropped_nl + _breaks(tail)
        elif held + len(tail) > limit:  # drop the row as it comes: never more than `limit` bytes held
            dropping, dropped = True, held + len(tail)
            dropped_nl = sum(_breaks(p) for p in parts) + _breaks(tail)
            parts, held = [], 0
        else:
            parts.append(tail)
            held += len(tail)
        if batch:
            yield batch
    if int(state[_STATE]) == _QUOTED:
        _check_encoding(path, compression)
        raise InputError("a quoted cell is not closed: the file ends inside its last row", path, hint=_HINT)
    if dropping:
        yield [TooLong(dropped, dropped_nl)]
    elif held:
        yield [b"".join(parts)]


def _header(path: str, delimiter: str, limit: int) -> list[str]:
    """The header of a file whose chunk starts after it: its first non-blank row, read in small blocks."""

    def blocks() -> Iterator[bytes]:
        with reading(path), open(path, "rb") as fh:
            yield from iter(lambda: fh.read(_HEADER_BLOCK), b"")

    rows = _rows(path, blocks(), delimiter, limit)
    line = 1
    try:
        for batch in rows:
            for row in batch:
                for start, got, _ in next(_parsed(path, iter([[row]]), delimiter, line)):
                    return _header_row(got, path, start)
                line += (_breaks(row) if isinstance(row, bytes) else row.newlines) + 1
    finally:
        rows.close()
    raise InputError("the file holds no header row naming the fields", path, hint=_HINT)


def _header_row(got: list[str] | str | TooLong, path: str, line: int) -> list[str]:
    """The field names of the header row; a header that cannot name the fields is a file-level error."""
    if isinstance(got, str) and got.startswith(_NOT_UTF8):
        _check_encoding(path, "")
        raise InputError(
            f"the header row is not UTF-8 text ({got.split('(', 1)[1].split(';')[0]})", path, line, hint=_ENCODING_HINT
        )
    if isinstance(got, str):
        raise InputError(f"the header row cannot name the fields ({got})", path, line, hint=_HINT)
    if not isinstance(got, list):
        raise InputError(f"the header row is over --max-record-bytes ({got.n_bytes} bytes)", path, line, hint=_HINT)
    if any("\0" in name for name in got):  # `csv` reads NUL bytes: a binary file's first bytes as names
        _check_encoding(path, "")
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
            line += _breaks(row) + 1
            if start == 1:
                row = row.removeprefix(BOM)  # a UTF-8 byte order mark starts the file, not the header
            try:
                text = row.decode("utf-8")
            except UnicodeDecodeError as exc:
                got.append((start + _breaks(row, 0, exc.start), not_utf8_reason(row, exc.start, "row"), False))
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


def _check_encoding(path: str, compression: str) -> None:
    """Before blaming a file's quoting or header: an InputError when its first MiB is not UTF-8 text (binary
    data holding a NUL byte, or text in another encoding), naming the first byte that is not and the fix."""
    found = _first_non_text(path, compression)
    if found is None:
        return
    at, byte, head = found
    for magic, what, fix in _MAGIC:
        if head.startswith(magic):
            raise InputError(f"the file is not CSV text: it is {what}", path, hint=fix)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_looking(head):  # Excel's "Unicode text"
        raise InputError(
            "the file is UTF-16 text, not UTF-8",
            path,
            hint="re-encode it as UTF-8 (e.g. iconv -f utf-16 -t utf-8 FILE > FILE.utf8.csv)",
        )
    controls = sum(1 for c in head if c < 32 and c not in (9, 10, 13))  # latin-1 text has none
    if byte == 0 or controls * 16 > len(head):
        shown = "a NUL byte" if byte == 0 else f"byte 0x{byte:02x}"
        raise InputError(
            f"the file is not CSV text: it holds {shown} at byte {at} and looks binary",
            path,
            hint="pass a CSV or TSV file of UTF-8 text",
        )
    raise InputError(
        f"the file is not UTF-8 text: byte 0x{byte:02x} at byte {at} is not UTF-8", path, hint=_ENCODING_HINT
    )


def _utf16_looking(head: bytes) -> bool:
    """UTF-16 without a byte order mark: ASCII text with a NUL byte beside every character."""
    pairs = head[: len(head) & ~1][:256]
    return len(pairs) >= 8 and (pairs[0::2].count(0) == len(pairs) // 2) != (pairs[1::2].count(0) == len(pairs) // 2)


def _first_non_text(path: str, compression: str) -> tuple[int, int, bytes] | None:
    """(offset, byte, the file's first bytes) of the first NUL or non-UTF-8 byte in the first MiB of the
    (decompressed) file, or None (also when it cannot be read: the caller's error stands)."""
    import codecs

    from packtool.stages.tokenize.inputs.streams import blocks

    decoder = codecs.getincrementaldecoder("utf-8")()
    seen = 0
    head = b""
    try:
        for block in blocks(path, compression):
            block = block[: _SNIFF_BYTES - seen]
            head = head or block[:256]
            nul = block.find(b"\0")
            try:
                decoder.decode(block[:nul] if nul >= 0 else block)
            except UnicodeDecodeError as exc:
                return seen + exc.start, block[exc.start], head
            if nul >= 0:
                return seen + nul, 0, head
            seen += len(block)
            if seen >= _SNIFF_BYTES:
                return None
    except (InputError, OSError):
        return None
    return None


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
