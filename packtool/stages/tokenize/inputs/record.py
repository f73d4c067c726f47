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


def too_long_reason(n_bytes: int, limit: int) -> str:
    return f"record is {n_bytes} bytes, over --max-record-bytes {limit} (raise the limit to accept it)"
