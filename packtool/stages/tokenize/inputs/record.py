"""What every reader yields: a record (a parsed value, or the reason it is unreadable) with its place.

Light on purpose (no numpy, no pyarrow): the stage's config and the CLI import the default limit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

#: default of --max-record-bytes: the longest record (a jsonl line, a .txt document, a parquet row).
#: Encoding one document takes ~130 bytes of memory per byte of text in `tokenizers` (measured: a 20 MB
#: record peaks at 2.7 GB RSS), so 16 MiB keeps one worker near 2 GB; a whole book is ~1 MB.
DEFAULT_MAX_RECORD_BYTES = 16 << 20
BOM = b"\xef\xbb\xbf"


class RawRecord(NamedTuple):
    """A parsed record or the reason it is unreadable; `line` is where it is (the reader's numbering: a
    1-based line, a 1-based row, or a 0-based index).

    A named tuple, not a dataclass: one is made per record, and a tuple is cheaper to build."""

    source: str
    line: int | None
    value: Any = None
    error: str | None = None


class PlainText(str):
    """A `.txt` document: the only record that is a bare string (a JSON string record is a bad record)."""


def not_utf8_reason(data: bytes, at: int, what: str) -> str:
    """Why a record's bytes are not text: the byte that is not UTF-8 (its offset in `what`: the row, the
    document) and the fix, re-encoding the file (latin-1 and Windows' cp1252 are the usual encodings)."""
    return (
        f"invalid UTF-8 (byte 0x{data[at]:02x} at byte {at} of the {what}; the file is not UTF-8 text: "
        "re-encode it as UTF-8, e.g. iconv -f latin1 -t utf-8)"
    )


def too_long_reason(n_bytes: int, limit: int) -> str:
    return f"record is {n_bytes} bytes, over --max-record-bytes {limit} (raise the limit to accept it)"
